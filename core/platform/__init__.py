"""What every process stands on: settings, the one error tree, ids, secrets, access and
projects, the dashboard's sessions, logging, retention and the archive, what a list is narrowed
to, the JSON APIs' answers, and which replica a call goes to."""
