"""The versioned SQL store: models, engine and sessions, the hash-chained ledger."""
