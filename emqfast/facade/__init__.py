"""facade layer (see docs/ARCHITECTURE.md)."""
