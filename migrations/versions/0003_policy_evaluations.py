"""policy_evaluations: every evaluation of a bundle over a period, also those that found nothing

A period evaluated without a finding is the compliant case; packs could not tell it from a period
never checked, and lowered the policy-based controls to "not evidenced".

Revision ID: 0003_policy_evaluations
Revises: 0002_lineage_not_exact
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

import collector.store.models

revision: str = "0003_policy_evaluations"
down_revision: Union[str, None] = "0002_lineage_not_exact"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('policy_evaluations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('cluster', sa.String(length=253), nullable=True),
    sa.Column('period_from_ns', sa.BigInteger(), nullable=False),
    sa.Column('period_to_ns', sa.BigInteger(), nullable=False),
    sa.Column('bundle_revision', sa.String(length=128), nullable=False),
    sa.Column('bundle_digest', sa.String(length=64), nullable=False),
    sa.Column('engine', sa.String(length=32), nullable=False),
    sa.Column('evaluated_at', collector.store.models.UTCDateTime(timezone=True), nullable=False),
    sa.Column('findings', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('policy_evaluations', schema=None) as batch_op:
        batch_op.create_index('ix_policy_evaluations_period', ['period_from_ns', 'period_to_ns'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('policy_evaluations', schema=None) as batch_op:
        batch_op.drop_index('ix_policy_evaluations_period')
    op.drop_table('policy_evaluations')
