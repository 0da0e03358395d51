"""worker layer (see docs/ARCHITECTURE.md)."""
