"""RULER: verdict cache, a group's RULER state, reward explanations, policies' RULER settings

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "ruler_verdicts",
        sa.Column("pk", PK, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("judge", sa.String(length=1024), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_ruler_verdicts"),
        sa.UniqueConstraint("key", name="uq_ruler_verdicts_key"),
    )
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("ruler_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("ruler_key", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("ruler_error", sa.Text(), nullable=True))
    with op.batch_alter_table("rewards") as batch:
        batch.add_column(sa.Column("explanation", sa.Text(), nullable=True))
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("ruler", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("ruler")
    with op.batch_alter_table("rewards") as batch:
        batch.drop_column("explanation")
    with op.batch_alter_table("groups") as batch:
        for column in ("ruler_error", "ruler_key", "ruler_at"):
            batch.drop_column(column)
    op.drop_table("ruler_verdicts")
