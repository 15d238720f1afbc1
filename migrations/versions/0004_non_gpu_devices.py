"""device_states: a device that is not a GPU has no GPU identity

Rows projected before this revision took the ``uuid`` of any device for its GPU identity
(``gpu_uuid = coalesce(physical_gpu_uuid, parent_uuid, uuid)``): a NIC driver's ``nic-0`` with a
``uuid`` of its own counted as a physical GPU (attributed, shared across tenants, listed in packs).
The projection now keeps ``uuid``/``parent_uuid``/``physical_gpu_uuid`` of a device only when it
is a GPU (``collector.kube.projections.is_gpu_device``: type gpu/mig/vfio, or a driver whose first
DNS label is ``gpu``); this re-derives the rows projected before the same way (the values stay in
``attributes``; the computed ``gpu_uuid`` follows). Lineage rows and findings computed from them
are not changed here: run ``draudit attribute --all`` and evaluate the policies again.

Revision ID: 0004_non_gpu_devices
Revises: 0003_policy_evaluations
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004_non_gpu_devices"
down_revision: Union[str, None] = "0003_policy_evaluations"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# is_gpu_device in SQL: not a GPU type, and the driver's first DNS label is not "gpu"
NOT_GPU = ("coalesce(device_type, '') NOT IN ('gpu', 'mig', 'vfio') "
           "AND driver <> 'gpu' AND driver NOT LIKE 'gpu.%'")


def upgrade() -> None:
    op.execute(sa.text(
        "UPDATE device_states SET uuid = NULL, parent_uuid = NULL, physical_gpu_uuid = NULL "
        f"WHERE ({NOT_GPU}) AND (uuid IS NOT NULL OR parent_uuid IS NOT NULL OR physical_gpu_uuid IS NOT NULL)"))


def downgrade() -> None:
    """Nothing to undo: the cleared values are in ``attributes``, and the previous revision's
    projection reads them again when the watcher republishes (the rows stay as derived here)."""
