"""Projects: a level between a tenant and its keys (limits, model allowlist, priority and weight
inside the tenant's share); ``api_keys.project_id`` and ``usage_records.project_id``. See
docs/admin.md (Projects).

Follows 0013 (budgets).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_projects_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.UniqueConstraint("tenant_id", "name", name="uq_projects_tenant_id_name"),
    )
    op.create_index("ix_projects_tenant_id", "projects", ["tenant_id"])
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("project_id", sa.String(length=32), nullable=True))
        batch.create_index("ix_api_keys_project_id", ["project_id"])
        batch.create_foreign_key(
            "fk_api_keys_project_id_projects", "projects", ["project_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("project_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("project_id")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint("fk_api_keys_project_id_projects", type_="foreignkey")
        batch.drop_index("ix_api_keys_project_id")
        batch.drop_column("project_id")
    op.drop_index("ix_projects_tenant_id", table_name="projects")
    op.drop_table("projects")
