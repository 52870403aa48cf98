"""search results in their own table

A search job's results document moves from ``plans`` (where it was stored under a key made from its job id,
``sha256("autoshard-search-results:" + job id)``, with ``kind = 'search'``) to ``searches``, keyed by its job
id beside the job's content hash. Existing rows move with their job's hash; rows whose job is gone (retention
deletes both, a few seconds apart) could no longer be read and are dropped, and so are their readers.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "searches",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("problem_hash", sa.String(64), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("solve_seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.execute(
        sa.text(
            "INSERT INTO searches (job_id, problem_hash, document, solve_seconds, created_at) "
            "SELECT plans.job_id, jobs.problem_hash, plans.document, plans.solve_seconds, plans.created_at "
            "FROM plans JOIN jobs ON jobs.id = plans.job_id WHERE plans.kind = 'search'"
        )
    )
    op.execute(
        sa.text("DELETE FROM plan_readers WHERE hash IN (SELECT hash FROM plans WHERE kind = 'search')")
    )
    op.execute(sa.text("DELETE FROM plans WHERE kind = 'search'"))


def downgrade() -> None:
    connection = op.get_bind()
    rows = connection.execute(
        sa.text(
            "SELECT searches.job_id, searches.document, searches.solve_seconds, searches.created_at, "
            "jobs.owner FROM searches LEFT JOIN jobs ON jobs.id = searches.job_id"
        )
    ).all()
    for job_id, document, seconds, created_at, owner in rows:
        key = hashlib.sha256(f"autoshard-search-results:{job_id}".encode()).hexdigest()
        connection.execute(
            sa.text(
                "INSERT INTO plans (hash, kind, document, job_id, solve_seconds, created_at) "
                "VALUES (:hash, 'search', :document, :job_id, :seconds, :created_at)"
            ),
            {
                "hash": key,
                "document": document,
                "job_id": job_id,
                "seconds": seconds,
                "created_at": created_at,
            },
        )
        connection.execute(
            sa.text(
                "INSERT INTO plan_readers (hash, principal, created_at) VALUES (:hash, :owner, :created_at)"
            ),
            {"hash": key, "owner": owner or "anonymous", "created_at": created_at},
        )
    op.drop_table("searches")
