"""The C backend: a thin wrapper over the compiled C core ``emqfast.backends._emqcore``
(csrc/), with the same names as its pure-Python twin :mod:`emqfast.backends.pure`.

Importing this module raises ImportError when the extension was not built;
:mod:`emqfast.backends.select` catches that and falls back to ``pure``.

It gathers three modules, each with one concern:

- :mod:`~emqfast.backends.native_scores`: score packing and backoff curves (C
  arithmetic that returns exactly what ``pure`` returns, falling back to it for inputs
  C cannot represent);
- :mod:`~emqfast.backends.native_batcher`: :class:`Batcher`, pipelined EVALSHA over
  one hiredis connection of its own, and the arguments, replies and failure codes
  crossing its C boundary.
"""
from __future__ import annotations

from emqfast.backends.native_batcher import Batcher  # noqa: F401
from emqfast.backends.native_scores import (  # noqa: F401 - the names pure offers
    backoff_delay, backoff_delay_many, pack_delayed, pack_delayed_many, pack_priority,
    pack_priority_many, splitmix64, unpack_delayed, unpack_priority)
from emqfast.backends.pure import optional_seed  # noqa: F401 - same API as pure
from emqfast.core.errors import RangeError  # noqa: F401 - pure offers it too
from emqfast.core.scores import (COUNTER_MOD, EPOCH_MS, KIND_EXPONENTIAL, KIND_FIXED,  # noqa: F401
                                 M64, MAX_OFFSET_MS, MAX_RUN_AT_MS, PRIORITY_BITS, PRIORITY_MAX,
                                 SEQ_BITS, SEQ_MASK)

__all__ = ["Batcher", "COUNTER_MOD", "EPOCH_MS", "KIND_EXPONENTIAL", "KIND_FIXED", "M64",
           "MAX_OFFSET_MS", "MAX_RUN_AT_MS", "PRIORITY_BITS", "PRIORITY_MAX", "RangeError",
           "SEQ_BITS", "SEQ_MASK", "backoff_delay", "backoff_delay_many", "optional_seed",
           "pack_delayed", "pack_delayed_many", "pack_priority", "pack_priority_many",
           "splitmix64", "unpack_delayed", "unpack_priority"]
