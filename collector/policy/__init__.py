"""Policy evaluation: facts in SQL (``facts``) → Rego engines (``engines``) → stored findings (``findings``).

The bundle (``bundle``) is an OPA bundle directory; ``policies/`` is the one draudit ships.
"""
