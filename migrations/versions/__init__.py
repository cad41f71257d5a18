"""Alembic revisions (a package so that it installs with burnish; Alembic skips this file)."""
