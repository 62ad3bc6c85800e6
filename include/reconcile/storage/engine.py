"""The ledger's database: its engine (SQLite or PostgreSQL, writers linearized) and its schema's
Alembic migrations (upgrade, downgrade, the revision a database is at, the newest one)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


@lru_cache(maxsize=1)
def head() -> str:
    """The newest migration: the highest ``NNNN`` of ``versions/NNNN_*.py``, each file's revision
    being its number and the history one line (tests/test_metadata.py holds both to Alembic's own
    reading). A listing, not Alembic's script directory: every CLI command and task opens the
    ledger, and Alembic's import and parse cost it a tenth of a second or more."""
    revs = [p.name[:4] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")]
    assert revs, f"no migrations under {MIGRATIONS}"
    return max(revs)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record):  # let SQLAlchemy emit BEGIN itself
            dbapi_conn.isolation_level = None
            dbapi_conn.execute("PRAGMA journal_mode=WAL")

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):  # take the write lock up front: linearizes writers
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


def _alembic_config(connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    from alembic import command

    with engine.begin() as conn:
        command.downgrade(_alembic_config(conn), revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()


def current_revision_safe(engine: Engine) -> str | None:
    try:
        return current_revision(engine)
    except Exception:  # noqa: BLE001 - only used to decide whether to re-raise the original
        return None
