"""Imports every module that defines tables, so ``Base.metadata`` is the whole schema.

Alembic's ``env.py`` and the ledger import this module; a new model module is added here.
"""

from collector.store import models  # noqa: F401
from collector.store.models import Base

metadata = Base.metadata
