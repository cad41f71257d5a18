"""The calls' two indexes, reshaped so that a version's calls are read by version and time, and a
trajectory's versions from its own calls.

``ix_calls_version (policy, policy_step, started_at, trajectory_id, status)`` replaces
``ix_calls_policy_trajectory (policy, trajectory_id, policy_step, status, started_at)``: a canary
trial reads what the two versions served since it began, and the rollback watch a version's
newest calls, instead of every call of the policy grouped by trajectory.
``ix_calls_trajectory (trajectory_id, started_at, policy, policy_step, status)`` replaces
``ix_calls_trajectory_id_started_at (trajectory_id, started_at)``: a trajectory's calls in order as
before, and which policy and step answered each, read from the index alone. Still two indexes
on the calls: a recorded call writes the same number of index entries, a few bytes wider.

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_calls_trajectory", "calls", ["trajectory_id", "started_at", "policy", "policy_step", "status"])
    op.drop_index("ix_calls_trajectory_id_started_at", table_name="calls")
    op.create_index("ix_calls_version", "calls", ["policy", "policy_step", "started_at", "trajectory_id", "status"])
    op.drop_index("ix_calls_policy_trajectory", table_name="calls")


def downgrade() -> None:
    op.create_index("ix_calls_policy_trajectory", "calls", ["policy", "trajectory_id", "policy_step", "status", "started_at"])
    op.drop_index("ix_calls_version", table_name="calls")
    op.create_index("ix_calls_trajectory_id_started_at", "calls", ["trajectory_id", "started_at"])
    op.drop_index("ix_calls_trajectory", table_name="calls")
