"""How a policy's calls are served, and what the gateway changed to serve one:

- ``policies.serving``, the policy's serving settings (core.learning.policies.ServingSettings: what it
  does with a hosted tool a client offers);
- ``calls.adjustments``, what the gateway changed of a call to serve it (core.protocols.records.Adjustments:
  tools left out, max_tokens lowered to fit the served window).

Revision ID: 0021
Revises: 0020
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("policies", sa.Column("serving", sa.JSON(), nullable=True))
    op.add_column("calls", sa.Column("adjustments", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("adjustments")
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("serving")
