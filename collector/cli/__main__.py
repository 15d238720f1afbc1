"""``python -m collector.cli`` runs the ``draudit`` command."""

from collector.cli import main

main()
