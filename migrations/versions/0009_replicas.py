"""policies.replicas: where each vLLM replica stands for the policy

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: SQLite adds it with a plain ALTER TABLE, no rebuild.
    op.add_column("policies", sa.Column("replicas", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("policies", "replicas")
