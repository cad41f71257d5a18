"""Lone attempts (core/learning/lone.py): traffic that answers each request once trains against a baseline.

- ``groups.lacks`` gains a level, ``PEERS`` (a lone attempt, rewarded), between ``NOTHING`` and
  ``SPREAD``: the levels above it move up by one. Waiting groups are left unsettled (NULL), so
  the store works out again what each lacks, a lone one included; trained ones are renumbered.
- ``policies.lone_expired``: how many of the policy's lone attempts expired unrewarded;
  ``policies.next_judged`` and ``next_unreadable``: how many answers the next-message judge
  scored, and how many it gave no readable verdict for.
- ``lone_baselines``: each policy's running statistics of its lone rewards, per kind of request.
- ``trajectories.followed``: what followed a lone attempt's answer, for a teacher with hindsight.

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("UPDATE groups SET lacks = NULL WHERE closed_at IS NOT NULL AND trained_at IS NULL")
    op.execute("UPDATE groups SET lacks = lacks + 1 WHERE lacks >= 1")
    for column in ("lone_expired", "next_judged", "next_unreadable"):
        op.add_column("policies", sa.Column(column, sa.Integer(), nullable=False, server_default="0"))
    op.add_column("trajectories", sa.Column("followed", sa.JSON(), nullable=True))
    op.create_table(
        "lone_baselines",
        sa.Column("policy", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=False),
        sa.Column("variance", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("lone_baselines")
    with op.batch_alter_table("trajectories") as batch:
        batch.drop_column("followed")
    with op.batch_alter_table("policies") as batch:
        for column in ("lone_expired", "next_judged", "next_unreadable"):
            batch.drop_column(column)
    op.execute("UPDATE groups SET lacks = NULL WHERE lacks = 1")
    op.execute("UPDATE groups SET lacks = lacks - 1 WHERE lacks >= 2")
