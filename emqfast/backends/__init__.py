"""backends layer (see docs/ARCHITECTURE.md)."""
