"""Lone attempts (core/learning/lone.py): traffic that answers each request once trains against a baseline.

- ``groups.lacks`` gains a level, ``PEERS`` (a lone attempt, rewarded), between ``NOTHING`` and
  ``SPREAD``: the levels above it move up by one. A group of one member that tied before stays
  ``SPREAD``: what was recorded before lone attempts trained does not start training now.
  Stop every gateway and trainer for this upgrade: one of the older ones would read the levels
  as they were.
- ``trajectories.policy``: the first policy a trajectory's calls went to; a trajectory in no group
  with one is a lone attempt, and ``ix_trajectories_lone`` holds those still waiting for their
  reward. Trajectories recorded before have none: they are no lone attempts.
- ``trajectories.followed``: what followed a lone attempt's answer, for a teacher with hindsight.
- ``policies.lone_expired`` (and ``lone_swept_until``, how far they were counted), ``next_judged``
  and ``next_unreadable``: the policy's lone attempts that expired unrewarded, and the answers
  the next-message judge scored or gave no readable verdict for.
- ``lone_baselines``: each policy's running statistics of its lone rewards, per kind of request.

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

LONE = {
    "sqlite": "policy IS NOT NULL AND group_id IS NULL AND reward IS NULL AND eval = 0",
    "postgresql": "policy IS NOT NULL AND group_id IS NULL AND reward IS NULL AND NOT eval",
}
COUNTERS = ("lone_expired", "next_judged", "next_unreadable")


def upgrade() -> None:
    op.execute("UPDATE groups SET lacks = lacks + 1 WHERE lacks >= 1")
    for column in COUNTERS:
        op.add_column("policies", sa.Column(column, sa.Integer(), nullable=False, server_default="0"))
    op.add_column("policies", sa.Column("lone_swept_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("trajectories", sa.Column("policy", sa.String(128), nullable=True))
    op.add_column("trajectories", sa.Column("followed", sa.JSON(), nullable=True))
    op.create_index(
        "ix_trajectories_lone", "trajectories", ["policy", "updated_at"], sqlite_where=sa.text(LONE["sqlite"]), postgresql_where=sa.text(LONE["postgresql"])
    )
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
    op.drop_index("ix_trajectories_lone", "trajectories")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): batch mode's rebuild of trajectories fails its calls' foreign key.
    op.drop_column("trajectories", "followed")
    op.drop_column("trajectories", "policy")
    with op.batch_alter_table("policies") as batch:
        for column in (*COUNTERS, "lone_swept_until"):
            batch.drop_column(column)
    op.execute("UPDATE groups SET lacks = NULL WHERE lacks = 1")
    op.execute("UPDATE groups SET lacks = lacks - 1 WHERE lacks >= 2")
