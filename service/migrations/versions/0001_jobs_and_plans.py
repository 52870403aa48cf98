"""jobs and plans

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("problem_hash", sa.String(64), nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        sa.Column("time_limit_s", sa.Float(), nullable=False),
        sa.Column("progress", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.Float(), nullable=True),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
    )
    op.create_index("ix_jobs_problem_hash", "jobs", ["problem_hash"])
    op.create_index("ix_jobs_state_created", "jobs", ["state", "created_at"])
    op.create_table(
        "plans",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("solve_seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("plans")
    op.drop_index("ix_jobs_state_created", "jobs")
    op.drop_index("ix_jobs_problem_hash", "jobs")
    op.drop_table("jobs")
