"""Versions: the package's, and the keyspace format recorded in each queue's meta hash.

Bump the keyspace *major* (``emqfast:N``) only for changes old clients would
misread; the boot fence in the scripts refuses clients of another major.
"""
__version__ = "0.1.0"
KEYSPACE_VERSION = "emqfast:1.0"
