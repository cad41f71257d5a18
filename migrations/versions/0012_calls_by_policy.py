"""The promotion queries' index: a policy's calls by trajectory, with the step, status and start
each query reads, so that a trial's evidence, the held-out scores and the rollback watch read
the index alone (bench/promotion_queries.py: 5-10x faster on SQLite at a million calls, 2-7x
on PostgreSQL; about 70 MB per million calls, and under 20 us more per recorded call). It
replaces (policy, policy_step), whose every use it covers.

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ["policy", "trajectory_id", "policy_step", "status", "started_at"]


def upgrade() -> None:
    # Built in one statement: a store of a million calls takes a few seconds, during which
    # writes wait (PostgreSQL's CONCURRENTLY cannot run inside the migration's transaction).
    op.create_index("ix_calls_policy_trajectory", "calls", COLUMNS)
    op.drop_index("ix_calls_policy_policy_step", table_name="calls")


def downgrade() -> None:
    op.create_index("ix_calls_policy_policy_step", "calls", ["policy", "policy_step"])
    op.drop_index("ix_calls_policy_trajectory", table_name="calls")
