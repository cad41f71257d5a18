"""trajectories.eval and groups.eval: held out for evaluation, never trained on

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every row recorded before held-out trajectories existed was a training one. The default
    # is the literal '0' (false on PostgreSQL and SQLite alike): with an SQL expression there,
    # batch mode would rebuild the tables on SQLite, and `groups`, which `trajectories`
    # references, cannot be dropped and copied while foreign keys are enforced.
    for table in ("groups", "trajectories"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("eval", sa.Boolean(), server_default="0", nullable=False))
    with op.batch_alter_table("trajectories") as batch:
        # Partial: only the held-out rows, a few among many, where their scores are read from.
        batch.create_index("ix_trajectories_eval", ["eval"], sqlite_where=sa.text("eval = 1"), postgresql_where=sa.text("eval"))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch mode's rebuild, for the same reason.
    op.drop_index("ix_trajectories_eval", table_name="trajectories")
    for table in ("trajectories", "groups"):
        op.drop_column(table, "eval")
