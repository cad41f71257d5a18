"""Promotion: a policy's rule and its candidate on trial; each step's decisions, with their
figures; the project a policy belongs to and the projects it is shared with

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: SQLite adds each with a plain ALTER TABLE, no rebuild. A policy made
    # before promotion existed reads as the defaults: `immediate`, as it behaved.
    op.add_column("policies", sa.Column("promotion", sa.JSON(), nullable=True))
    op.add_column("policies", sa.Column("candidate", sa.Integer(), nullable=True))
    op.add_column("policies", sa.Column("candidate_since", sa.DateTime(timezone=True), nullable=True))
    # NULL: the policy is shared by every project, as every policy was before projects owned them.
    op.add_column("policies", sa.Column("project", sa.String(64), nullable=True))
    op.add_column("policies", sa.Column("shared_with", sa.JSON(), nullable=True))
    op.add_column("steps", sa.Column("decision", sa.String(16), nullable=True))
    op.add_column("steps", sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("steps", sa.Column("decisions", sa.JSON(), nullable=True))


def downgrade() -> None:
    for column in ("decisions", "decided_at", "decision"):
        op.drop_column("steps", column)
    for column in ("shared_with", "project", "candidate_since", "candidate", "promotion"):
        op.drop_column("policies", column)
