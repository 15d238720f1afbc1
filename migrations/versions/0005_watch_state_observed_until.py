"""watch_state.observed_until_ns: a kind's last contact while it is out of contact, kept across a crash

A run killed (no clean stop) while one kind's requests failed or its stream was silent, the other
kinds' bookmarks keeping the run alive, left that kind 'synced' until the run's last sign of life:
changes made during the outage, never seen, fell inside 'synced' coverage. The reflector now
records the kind's last contact here on the way into the outage (cleared on the way out), and a
run's first transaction freezes the previous run's coverage end of every kind it left 'synced'.
NULL (every existing row): no such bound, as before.

Revision ID: 0005_watch_state_observed_until
Revises: 0004_non_gpu_devices
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005_watch_state_observed_until"
down_revision: Union[str, None] = "0004_non_gpu_devices"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("watch_state", schema=None) as batch_op:
        batch_op.add_column(sa.Column("observed_until_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("watch_state", schema=None) as batch_op:
        batch_op.drop_column("observed_until_ns")
