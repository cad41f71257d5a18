"""The store: SQLAlchemy tables, the group-commit writer, and every query, as plain functions.

Above the domain (``core``), below the gateway and the trainer. It raises the domain's
errors (``core/platform/errors.py``), never HTTP ones; its functions take a SQLAlchemy
``Connection`` and are run by ``Database.transaction`` (writes) or ``Database.read``.
"""
