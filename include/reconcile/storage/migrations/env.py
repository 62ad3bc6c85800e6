"""Alembic environment for the sink's ledger (run through reconcile.storage.engine.upgrade)."""

from alembic import context

config = context.config
connection = config.attributes.get("connection")


def run_migrations_online() -> None:
    context.configure(connection=connection, target_metadata=None, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is None:
    raise RuntimeError("run migrations through `python -m reconcile db upgrade`")
run_migrations_online()
