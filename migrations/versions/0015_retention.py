"""Retention: each project's setting (keep N days; prune what kept versions trained on or not)

Revision ID: 0015
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "retention",
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("days", sa.Float()),
        sa.Column("prune_trained", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project", name="pk_retention"),
    )


def downgrade() -> None:
    op.drop_table("retention")
