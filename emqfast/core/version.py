"""Versions: the package's, and the keyspace format recorded in each queue's meta hash.

Bump the keyspace *major* (``emqfast:N``) only for changes old clients would
misread; the boot fence in the scripts refuses clients of another major.
"""
__version__ = "0.1.0"
# 2.0: compact job hashes. Defaults are not stored (a missing 'opts' means the library
# defaults: a 1.x reader would take it as one attempt and never retry), waiting jobs carry
# no 'state', parked ones no 'run_at'; complete.lua takes a batch. 2.x readers still read
# 1.x hashes, but the fence is symmetric: a queue keeps the major it was created with.
KEYSPACE_VERSION = "emqfast:2.0"
