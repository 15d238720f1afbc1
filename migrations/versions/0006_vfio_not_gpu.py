"""device_states: a vfio device of a driver that is no GPU driver has no GPU identity

Rows projected before this revision took any device of ``type`` ``vfio`` for a GPU (passed
through): an SR-IOV NIC driver's virtual functions, published as ``vfio`` too, kept their ``uuid``
for a GPU identity (``gpu_uuid = coalesce(physical_gpu_uuid, parent_uuid, uuid)``), and policy
facts counted them in GPU overlaps and handovers. ``collector.kube.projections.is_gpu_device`` now
counts ``vfio`` only from a GPU driver (first DNS label ``gpu``: ``gpu.nvidia.com``'s
``gpu-vfio-N``); this re-derives the rows projected before the same way (the values stay in
``attributes``; the computed ``gpu_uuid`` follows). Policy facts read the rule from the code (no
stored flag). Lineage rows and findings computed from the old rows are not changed here: run
``draudit attribute --all`` and evaluate the policies again.

Revision ID: 0006_vfio_not_gpu
Revises: 0005_watch_state_observed_until
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006_vfio_not_gpu"
down_revision: Union[str, None] = "0005_watch_state_observed_until"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# The rows 0004 left a GPU identity that is_gpu_device (as of this revision) denies: type vfio,
# and a driver whose first DNS label is not "gpu" (stated here, not imported: a revision keeps the
# rule of its time).
VFIO_NOT_GPU = "device_type = 'vfio' AND driver <> 'gpu' AND driver NOT LIKE 'gpu.%'"


def upgrade() -> None:
    op.execute(sa.text(
        "UPDATE device_states SET uuid = NULL, parent_uuid = NULL, physical_gpu_uuid = NULL "
        f"WHERE ({VFIO_NOT_GPU}) AND (uuid IS NOT NULL OR parent_uuid IS NOT NULL OR physical_gpu_uuid IS NOT NULL)"))


def downgrade() -> None:
    """Nothing to undo: the cleared values are in ``attributes``, and the previous revision's
    projection reads them again when the watcher republishes (the rows stay as derived here)."""
