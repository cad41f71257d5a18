"""rewards.call_pk: a reward posted for one call of a trajectory (credit per turn)

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: SQLite adds it with a plain ALTER TABLE, no rebuild. No foreign key
    # either (SQLite cannot add one to an existing table); the writer checks the call exists.
    op.add_column("rewards", sa.Column("call_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True))
    op.create_index("ix_rewards_call_pk", "rewards", ["call_pk"])


def downgrade() -> None:
    op.drop_index("ix_rewards_call_pk", "rewards")
    op.drop_column("rewards", "call_pk")
