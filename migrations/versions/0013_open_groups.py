"""A policy's open groups, oldest first: the index the idle close reads every few seconds
(store/writes.py: close_idle_groups), partial so that it holds only the groups still open.

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN = sa.text("closed_at IS NULL")


def upgrade() -> None:
    op.create_index("ix_groups_open", "groups", ["policy", "created_at"], sqlite_where=OPEN, postgresql_where=OPEN)


def downgrade() -> None:
    op.drop_index("ix_groups_open", table_name="groups")
