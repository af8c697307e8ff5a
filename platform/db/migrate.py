"""Programmatic Alembic: the script location is computed from the installed package, so
``loraplex db upgrade`` works from any working directory."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import loraplex.migrations


def _script_location() -> str:
    # loraplex.migrations is a namespace package (no __init__.py): take its folder from __path__.
    return str(Path(next(iter(loraplex.migrations.__path__))))


def alembic_config(db_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", db_url.replace("%", "%%"))
    return cfg


def upgrade(db_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(db_url), revision)


def downgrade(db_url: str, revision: str) -> None:
    command.downgrade(alembic_config(db_url), revision)


def current_heads() -> list[str]:
    from alembic.script import ScriptDirectory

    return list(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())
