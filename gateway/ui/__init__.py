"""The dashboard: server-rendered pages under ``/ui`` (docs/dashboard.md)."""
