"""groups: the policy they train, and their training claim

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("policy", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("claimed_by", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("trained_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("trained_step", sa.Integer(), nullable=True))
        batch.create_index("ix_groups_policy", ["policy"])


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_index("ix_groups_policy")
        for column in ("trained_step", "trained_at", "claimed_at", "claimed_by", "policy"):
            batch.drop_column(column)
