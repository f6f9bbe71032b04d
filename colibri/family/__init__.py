"""The code over the registry's facts: shared builders and drivers, one module per family's own
parts, and parts.py, the one lookup from a family to them (stdlib only)."""
