"""API keys, projects and the gateways' heartbeats

trajectories.project and groups.project name the project a row belongs to; the ids of a
project other than the default are stored as "<project>/<id>" (core/platform/access.py), so the id
columns widen to 200 characters. Rows recorded before projects existed belong to the
default project, whose ids are stored as they are: nothing of them changes.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, column) holding a trajectory or group id.
ID_COLUMNS = [("groups", "id"), ("trajectories", "id"), ("trajectories", "group_id"), ("calls", "trajectory_id"), ("rewards", "trajectory_id")]


def upgrade() -> None:
    # A literal server default: see 0007 for why SQLite's batch mode must not rebuild these tables.
    for table in ("groups", "trajectories"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("project", sa.String(64), server_default="default", nullable=False))
    op.create_index("ix_trajectories_project_pk", "trajectories", ["project", "pk"])
    # SQLite does not enforce a VARCHAR's length; PostgreSQL does, and alters in place.
    if op.get_bind().dialect.name == "postgresql":
        for table, column in ID_COLUMNS:
            op.alter_column(table, column, type_=sa.String(200), existing_type=sa.String(128))

    op.create_table(
        "api_keys",
        sa.Column("pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("rpm_limit", sa.Integer()),
        sa.Column("max_parallel_requests", sa.Integer()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("pk", name="pk_api_keys"),
        sa.UniqueConstraint("id", name="uq_api_keys_id"),
        sa.UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    )
    op.create_index("ix_api_keys_project", "api_keys", ["project"])
    op.create_table(
        "gateways",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_gateways"),
    )


def downgrade() -> None:
    op.drop_table("gateways")
    op.drop_index("ix_api_keys_project", table_name="api_keys")
    op.drop_table("api_keys")
    if op.get_bind().dialect.name == "postgresql":
        for table, column in ID_COLUMNS:
            op.alter_column(table, column, type_=sa.String(128), existing_type=sa.String(200))
    op.drop_index("ix_trajectories_project_pk", table_name="trajectories")
    # Plain DROP COLUMN (SQLite 3.35+), as in 0007.
    for table in ("trajectories", "groups"):
        op.drop_column(table, "project")
