"""Alembic environment: runs the migrations on the connection (or URL) the service hands over.

On PostgreSQL an advisory lock is held while migrating, so replicas starting at once migrate one at a time.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, text

from service.store.models import Base

MIGRATION_LOCK_ID = 0x6175746F  # "auto"


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        postgresql = connection.dialect.name == "postgresql"
        if postgresql:
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            connection.commit()
        try:
            _run(connection)
        finally:
            if postgresql:
                connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
                connection.commit()
    engine.dispose()


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
