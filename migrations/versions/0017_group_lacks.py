"""What a closed group lacks to train, kept on its row (``groups.lacks``, core/learning/groups.py: Lack),
and the training queue's index by it: ``ix_groups_waiting`` becomes ``(policy, lacks, closed_at)``
over the same closed, untrained groups, so that a ready group is one index entry however many
ties, unrewarded and held-out groups wait beside it.

Existing groups start with ``lacks`` NULL, which the store reads as "not settled": the queue
works it out from the members for those groups, and the trainer's next claim settles them once.

Revision ID: 0017
Revises: 0016
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WAITING = sa.text("closed_at IS NOT NULL AND trained_at IS NULL")


def upgrade() -> None:
    op.add_column("groups", sa.Column("lacks", sa.SmallInteger(), nullable=True))
    op.drop_index("ix_groups_waiting", table_name="groups")
    op.create_index("ix_groups_waiting", "groups", ["policy", "lacks", "closed_at"], sqlite_where=WAITING, postgresql_where=WAITING)


def downgrade() -> None:
    op.drop_index("ix_groups_waiting", table_name="groups")
    op.create_index("ix_groups_waiting", "groups", ["policy", "closed_at"], sqlite_where=WAITING, postgresql_where=WAITING)
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch mode's rebuild: `groups`, which
    # `trajectories` references, cannot be dropped and copied while foreign keys are enforced.
    op.drop_column("groups", "lacks")
