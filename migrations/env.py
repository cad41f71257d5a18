"""Alembic environment.

burnish runs migrations itself (``burnish db upgrade``, or at start) and hands
Alembic an open connection through ``config.attributes["connection"]``. Run from
the ``alembic`` command line (for ``alembic revision --autogenerate``) it opens
its own engine from ``sqlalchemy.url`` or ``BURNISH_DATABASE_URL``.
"""

import asyncio

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine

from burnish_server.core.platform.settings import Settings
from burnish_server.store.database import compare_type
from burnish_server.store.models import Base

config = context.config
target_metadata = Base.metadata


def do_run_migrations(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=compare_type,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    url = config.get_main_option("sqlalchemy.url") or Settings.load().resolved_database_url
    engine = create_async_engine(url)
    async with engine.begin() as connection:
        await connection.run_sync(do_run_migrations)
    await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    do_run_migrations(connection)
elif context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(run_async_migrations())
