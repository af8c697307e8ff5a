"""Alembic environment wired to the platform's metadata and settings.

The URL comes from (in order) a connection handed over in ``config.attributes``, the
``sqlalchemy.url`` option, or the platform settings (TOML + LORAPLEX_* environment).
"""

from __future__ import annotations

from alembic import context

from loraplex.platform.db.metadata import metadata
from loraplex.platform.db.session import make_db_engine

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from loraplex.platform.settings import load_settings

    return load_settings().db_url


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_db_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
