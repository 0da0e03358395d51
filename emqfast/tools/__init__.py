"""tools layer (see docs/ARCHITECTURE.md)."""
