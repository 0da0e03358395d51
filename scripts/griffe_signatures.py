"""A griffe extension for the API reference: the classes whose constructor griffe cannot
see get one, so the reference shows how to make them like any other class.

griffe reads source, so it sees no ``__init__`` where Python makes it:

* an error class that only inherits ``Exception.__init__`` (``ReplyLost``, ``EmqError``)
  is shown as ``ReplyLost(*args)``, what ``Exception`` takes;
* a ``NamedTuple`` (``Entry``) is shown with its fields as parameters, in order, with
  their annotations and defaults: ``Entry(rank: int, member: str, score: float)``.

Enums are left alone (their members are the values; nobody constructs one). Registered in
mkdocs.yml next to ``griffe_roles.py``.
"""
from __future__ import annotations

import builtins
from typing import Any, Iterator, List, Optional

import griffe
from griffe import ParameterKind

PACKAGE = "emqfast"
# (griffe types the members of its enum as their str values: name them as the enum's)
POSITIONAL = ParameterKind("positional or keyword")
VAR_POSITIONAL = ParameterKind("variadic positional")


class ConstructorSignatures(griffe.Extension):
    """Adds the ``__init__`` Python makes for exceptions and NamedTuples."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        for cls in _classes(pkg):
            init = _made_init(cls)
            if init is not None:
                cls.set_member("__init__", init)


def _classes(obj: Any) -> Iterator[griffe.Class]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            yield member
        if member.is_module or member.is_class:
            yield from _classes(member)


def _base_names(cls: griffe.Class) -> List[str]:
    return [str(base).rpartition(".")[2] for base in cls.bases]


def _made_init(cls: griffe.Class) -> Optional[griffe.Function]:
    """The ``__init__`` Python gives ``cls`` when griffe sees none, else None."""
    if "NamedTuple" in _base_names(cls):
        fields: List[Any] = [attr for attr in cls.members.values()
                             if not attr.is_alias and attr.is_attribute
                             and attr.annotation is not None  # type: ignore[union-attr]
                             and not attr.name.startswith("_")]
        params = [griffe.Parameter(attr.name, annotation=attr.annotation, default=attr.value,
                                   kind=POSITIONAL) for attr in fields]
        return _init(cls, params)
    try:
        if any("__init__" in c.members for c in [cls, *cls.mro()]):
            return None
    except ValueError:  # an inconsistent MRO: leave it to griffe
        return None
    if _is_builtin_exception_subclass(cls):
        return _init(cls, [griffe.Parameter("args", kind=VAR_POSITIONAL)])
    return None


def _is_builtin_exception_subclass(cls: griffe.Class) -> bool:
    """True when ``cls``'s bases end, beyond the package, in a builtin exception."""
    for base in [cls, *cls.mro()]:
        for name in _base_names(base):
            builtin = getattr(builtins, name, None)
            if isinstance(builtin, type) and issubclass(builtin, BaseException):
                return True
    return False


def _init(cls: griffe.Class, params: List[griffe.Parameter]) -> griffe.Function:
    self_param = griffe.Parameter("self", kind=POSITIONAL)
    return griffe.Function("__init__", parameters=griffe.Parameters(self_param, *params),
                           lineno=cls.lineno, endlineno=cls.lineno, parent=cls)
