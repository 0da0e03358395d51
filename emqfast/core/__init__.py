"""core layer (see docs/ARCHITECTURE.md)."""
