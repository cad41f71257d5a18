"""calls.response_id: Responses API answers served for a policy, continued by previous_response_id

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("response_id", sa.String(length=128), nullable=True))
        batch.create_index("ix_calls_response_id", ["response_id"])


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_index("ix_calls_response_id")
        batch.drop_column("response_id")
