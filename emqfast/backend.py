"""Public name of :mod:`emqfast.backends.select`: ``emqfast.backend()`` says which backend is
live, ``emqfast.backend.use("python")`` picks one. The same module object, not a copy."""
import sys

from emqfast.backends import select

sys.modules[__name__] = select
