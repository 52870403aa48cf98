"""job owners, one live job per owner and problem, plan readers

Jobs record the principal that submitted them (existing jobs: ``anonymous``, the principal of a service
without tokens) and how many plans they make; a unique partial index keeps one queued or running job per
owner and problem hash (identical submissions at once become one job: duplicates already live are canceled,
the oldest stays); ``plan_readers`` lists who may read each stored result (existing results: ``anonymous``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

LIVE = sa.text("state IN ('queued', 'running')")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(128), nullable=False, server_default="anonymous"))
        batch.add_column(sa.Column("candidates", sa.Integer(), nullable=False, server_default="1"))
    op.execute(
        sa.text(
            "UPDATE jobs SET state = 'canceled', finished_at = :now, lease_owner = NULL, "
            "lease_expires_at = NULL, error = :error "
            "WHERE state IN ('queued', 'running') AND EXISTS (SELECT 1 FROM jobs AS older "
            "WHERE older.problem_hash = jobs.problem_hash AND older.owner = jobs.owner "
            "AND older.state IN ('queued', 'running') "
            "AND (older.created_at < jobs.created_at "
            "OR (older.created_at = jobs.created_at AND older.id < jobs.id)))"
        ).bindparams(
            now=time.time(),
            error='{"type": "merged", "message": "an identical job submitted earlier runs instead"}',
        )
    )
    op.create_index("ix_jobs_owner_created", "jobs", ["owner", "created_at"])
    op.create_index(
        "ux_jobs_live_hash",
        "jobs",
        ["owner", "problem_hash"],
        unique=True,
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    )
    op.create_table(
        "plan_readers",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("principal", sa.String(128), primary_key=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.execute(
        sa.text(
            "INSERT INTO plan_readers (hash, principal, created_at) "
            "SELECT hash, 'anonymous', created_at FROM plans"
        )
    )


def downgrade() -> None:
    op.drop_table("plan_readers")
    op.drop_index("ux_jobs_live_hash", "jobs")
    op.drop_index("ix_jobs_owner_created", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("candidates")
        batch.drop_column("owner")
