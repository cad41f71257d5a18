"""Held-out scores kept as they are settled: each rewarded held-out trajectory's version of each
policy it called, with its reward, in ``held_out`` (indexed by version), and ``trajectories.scored``
saying its rows stand (store/evals.py). A policy's held-out scores and an eval trial then read
that policy's entries, not every held-out trajectory's calls.

The held-out trajectories already rewarded are settled here, from their calls.

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNSCORED = {"sqlite": "eval = 1 AND reward IS NOT NULL AND scored = 0", "postgresql": "eval AND reward IS NOT NULL AND NOT scored"}


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("scored", sa.Boolean(), server_default="0", nullable=False))
    op.create_table(
        "held_out",
        sa.Column("trajectory_pk", PK, nullable=False),
        sa.Column("policy", sa.String(length=128), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["trajectory_pk"], ["trajectories.pk"], name=op.f("fk_held_out_trajectory_pk_trajectories")),
        sa.PrimaryKeyConstraint("trajectory_pk", "policy", name=op.f("pk_held_out")),
    )
    op.create_index("ix_held_out_version", "held_out", ["policy", "last_step", "first_step", "reward", "trajectory_pk"])
    op.execute(
        """
        INSERT INTO held_out (trajectory_pk, policy, first_step, last_step, reward)
        SELECT t.pk, c.policy, min(coalesce(c.policy_step, 0)), max(coalesce(c.policy_step, 0)), t.reward
        FROM trajectories t JOIN calls c ON c.trajectory_id = t.id
        WHERE t.eval AND t.reward IS NOT NULL AND c.status = 'ok' AND c.policy IS NOT NULL
        GROUP BY t.pk, c.policy, t.reward
        """
    )
    op.execute("UPDATE trajectories SET scored = eval WHERE reward IS NOT NULL")
    op.create_index(
        "ix_trajectories_unscored", "trajectories", ["scored"], sqlite_where=sa.text(UNSCORED["sqlite"]), postgresql_where=sa.text(UNSCORED["postgresql"])
    )


def downgrade() -> None:
    op.drop_index("ix_trajectories_unscored", table_name="trajectories")
    op.drop_index("ix_held_out_version", table_name="held_out")
    op.drop_table("held_out")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), as 0017 does for `groups`.
    op.drop_column("trajectories", "scored")
