"""calls: the policy and step that served a call

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("policy", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("policy_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("upstream_model", sa.String(length=256), nullable=True))
    op.create_index("ix_calls_policy_policy_step", "calls", ["policy", "policy_step"])


def downgrade() -> None:
    op.drop_index("ix_calls_policy_policy_step", table_name="calls")
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("upstream_model")
        batch.drop_column("policy_step")
        batch.drop_column("policy")
