"""Developer tool: regenerate the initial Alembic revision from the models.

Only while draudit has no release (no database in the field at 0001): afterwards every schema
change is a new revision. Usage: ``python -m collector.store.devtools regen``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from alembic import command

from collector.store.db import make_engine
from collector.store.migrate import MIGRATIONS_DIR, alembic_config

INITIAL = "0001_foundation"


def regen() -> Path:
    """Rewrite ``migrations/versions/0001_foundation.py`` from ``collector.store.schema.metadata``."""
    target = MIGRATIONS_DIR / "versions" / f"{INITIAL}.py"
    target.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/empty.db")
        command.revision(alembic_config(engine), message="initial schema", autogenerate=True, rev_id=INITIAL)
        engine.dispose()
    produced = next((MIGRATIONS_DIR / "versions").glob(f"{INITIAL}_*.py"))
    text = produced.read_text().replace("astext_type=Text()", "astext_type=sa.Text()")
    produced.unlink()
    target.write_text(text)
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["regen"]:
        sys.exit("usage: python -m collector.store.devtools regen")
    print(f"wrote {regen()}")
