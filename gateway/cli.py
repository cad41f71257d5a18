"""The ``burnish`` command."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from gateway.settings import Settings


def _settings(**overrides: object) -> Settings:
    try:
        return Settings.load(**overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.group()
@click.version_option(package_name="burnish")
def main() -> None:
    """burnish: train an agent from its own traffic."""


@main.command()
@click.option("--upstream", help="OpenAI-compatible server to forward to [BURNISH_UPSTREAM]")
@click.option("--host", help="address to listen on [BURNISH_HOST]")
@click.option("--port", type=int, help="port to listen on [BURNISH_PORT]")
@click.option("--data-dir", help="where the SQLite store lives [BURNISH_DATA_DIR]")
@click.option("--database-url", help="SQLAlchemy URL; PostgreSQL to scale out [BURNISH_DATABASE_URL]")
@click.option("--record/--no-record", default=None, help="record calls (default on) [BURNISH_RECORD]")
@click.option("--log-level", help="debug, info, warning, error [BURNISH_LOG_LEVEL]")
def gateway(**options: object) -> None:
    """Serve the gateway."""
    import uvicorn

    from gateway.app import create_app

    settings = _settings(**options)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs a line per upstream request at INFO: measured at ~0.1 ms a call, and noise.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    # uvicorn with uvloop and httptools: measured against granian in bench/asgi_servers.py (docs/performance.md).
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop" if sys.platform != "win32" else "asyncio",
        http="httptools",
        access_log=False,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=30,
    )


@main.group()
def db() -> None:
    """The store's schema."""


@db.command()
@click.option("--database-url", help="SQLAlchemy URL [BURNISH_DATABASE_URL]")
@click.option("--data-dir", help="[BURNISH_DATA_DIR]")
@click.argument("revision", default="head")
def upgrade(revision: str, **options: object) -> None:
    """Apply migrations up to REVISION (default: head)."""
    from gateway.store.database import Database

    settings = _settings(**options)

    async def run() -> None:
        database = Database(settings.resolved_database_url)
        try:
            await database.migrate(revision)
        finally:
            await database.dispose()

    asyncio.run(run())
    click.echo(f"database at {revision}: {_display_url(settings)}")


def _display_url(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    return make_url(settings.resolved_database_url).render_as_string(hide_password=True)


if __name__ == "__main__":
    main()
