"""What a policy's status and the trainer's poll read, bounded by what is in flight:

- ``ix_groups_claimed``, the groups a trainer holds: the poll's check for another trainer
  mid-step, and the status' count of closed groups, read a step's worth of entries instead of
  every group that waits (ties and unrewarded groups wait for good);
- ``ix_groups_policy_pk``, a policy's groups newest first: the groups list filtered to a policy
  walks it, where SQLite read all of the policy's groups by ``ix_groups_policy_closed`` and
  sorted them (0.25 s at a million calls);
- ``policies.candidate_test`` and ``candidate_tested_at``, the candidate's test as the trainer
  last read it: the status shows it instead of reading the trial again (a canary's trial costs
  what it served).

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CLAIMED = sa.text("claimed_by IS NOT NULL AND trained_at IS NULL")


def upgrade() -> None:
    op.create_index("ix_groups_claimed", "groups", ["policy"], sqlite_where=CLAIMED, postgresql_where=CLAIMED)
    op.create_index("ix_groups_policy_pk", "groups", ["policy", "pk"])
    op.add_column("policies", sa.Column("candidate_test", sa.JSON(), nullable=True))
    op.add_column("policies", sa.Column("candidate_tested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("candidate_tested_at")
        batch.drop_column("candidate_test")
    op.drop_index("ix_groups_policy_pk", table_name="groups")
    op.drop_index("ix_groups_claimed", table_name="groups")
