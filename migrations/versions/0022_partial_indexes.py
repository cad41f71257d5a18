"""Three indexes kept only for the rows they find: a call to no policy, or outside the Responses
API, and a trajectory in no group, write no entry in them.

- ``ix_calls_version`` where ``policy IS NOT NULL``: read by a policy's versions alone;
- ``ix_calls_response_id`` where ``response_id IS NOT NULL``: read by a response's id alone;
- ``ix_trajectories_group_members`` where ``group_id IS NOT NULL``: read by a group's id alone.

Every read of them names the column with ``=``, ``IN`` or a join on it, which both databases
take as "not NULL", so their plans keep them. A pass-through call, one trajectory and one call,
then writes 7 pages of SQLite's WAL where it wrote 10 (docs/performance.md). Rebuilding them
reads the two tables once: on a store of millions of calls, a minute or so of ``burnish db upgrade``.

Revision ID: 0022
Revises: 0021
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = (  # as store/models.py names them
    ("ix_calls_version", "calls", ["policy", "policy_step", "started_at", "trajectory_id", "status"], "policy IS NOT NULL"),
    ("ix_calls_response_id", "calls", ["response_id"], "response_id IS NOT NULL"),
    ("ix_trajectories_group_members", "trajectories", ["group_id", "eval", "reward"], "group_id IS NOT NULL"),
)


def upgrade() -> None:
    for name, table, columns, where in INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns, sqlite_where=sa.text(where), postgresql_where=sa.text(where))


def downgrade() -> None:
    for name, table, columns, _where in INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns)
