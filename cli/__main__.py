"""``python -m burnish_server.cli``: the ``burnish`` command without its console script."""

from burnish_server.cli.main import main

main()
