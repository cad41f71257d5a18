"""What every process stands on, and what names no other room: settings, the one error tree,
ids (and the name a version is served under), secrets, access and projects, the dashboard's
sessions, logging, retention and the archive, and which replica a call goes to."""
