"""Per-family layer-spec builders that family_registry composes (stdlib only)."""
