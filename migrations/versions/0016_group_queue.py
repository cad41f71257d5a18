"""The training queue and a policy's last closed groups, each read from an index of its own,
and a group's members with their rewards read from an index alone.

``ix_groups_waiting`` holds only the closed groups no trainer has finished (partial), so that the
trainer's poll and a policy's ready count read what waits, not every group the policy trained on;
``ix_groups_policy_closed`` gives a policy's groups by when they closed (the ties the status
reports). It replaces ``ix_groups_policy``, whose every use it covers. Groups are written once
per group, never per call: the proxy's path does not pay for either. ``ix_trajectories_group_members``
``(group_id, eval, reward)`` replaces ``(group_id)``: the same entries, wider, so that what
readiness counts of a group's members needs no read of their rows.

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WAITING = sa.text("closed_at IS NOT NULL AND trained_at IS NULL")


def upgrade() -> None:
    op.create_index("ix_groups_waiting", "groups", ["policy", "closed_at"], sqlite_where=WAITING, postgresql_where=WAITING)
    op.create_index("ix_groups_policy_closed", "groups", ["policy", "closed_at"])
    op.drop_index("ix_groups_policy", table_name="groups")
    op.create_index("ix_trajectories_group_members", "trajectories", ["group_id", "eval", "reward"])
    op.drop_index("ix_trajectories_group_id", table_name="trajectories")


def downgrade() -> None:
    op.create_index("ix_trajectories_group_id", "trajectories", ["group_id"])
    op.drop_index("ix_trajectories_group_members", table_name="trajectories")
    op.create_index("ix_groups_policy", "groups", ["policy"])
    op.drop_index("ix_groups_policy_closed", table_name="groups")
    op.drop_index("ix_groups_waiting", table_name="groups")
