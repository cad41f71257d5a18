from burnish.tasks.cli import main

main()
