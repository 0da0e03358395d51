"""Public name of :mod:`emqfast.core.errors` (``from emqfast.errors import ReplyLost``):
the same module object, not a copy."""
import sys

from emqfast.core import errors

sys.modules[__name__] = errors
