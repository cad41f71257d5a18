"""policies and their training steps, in the store (they were a JSON file)

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "policies",
        sa.Column("pk", PK, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("base_model", sa.String(length=256), nullable=False),
        sa.Column("model_path", sa.String(length=1024), nullable=True),
        sa.Column("lora", sa.JSON(), nullable=False),
        sa.Column("train", sa.JSON(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("head", sa.Integer(), nullable=False),
        sa.Column("train_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("load_error", sa.Text(), nullable=True),
        sa.Column("load_error_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_policies"),
        sa.UniqueConstraint("name", name="uq_policies_name"),
    )
    op.create_table(
        "steps",
        sa.Column("pk", PK, primary_key=True, autoincrement=True),
        sa.Column("policy", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=False),
        sa.Column("groups", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("checkpoint", sa.String(length=1024), nullable=False),
        sa.Column("trainer", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("publish_seconds", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["policy"], ["policies.name"], name="fk_steps_policy_policies"),
        sa.PrimaryKeyConstraint("pk", name="pk_steps"),
        sa.UniqueConstraint("policy", "step", name="uq_steps_policy_step"),
    )


def downgrade() -> None:
    op.drop_table("steps")
    op.drop_table("policies")
