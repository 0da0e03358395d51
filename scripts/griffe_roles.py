"""A griffe extension for the API reference: the Sphinx roles of emqfast's docstrings
(``:class:`~emqfast.errors.PermissionDenied```, ``:meth:`stop```, ``:mod:`emqfast.aio```,
``:func:``, ``:data:``, ``:attr:``) become mkdocs-autorefs cross-references when the
package is loaded, so the reference shows links instead of the roles' literal text.

A role's target is found as Sphinx finds it: a dotted path from the top (``emqfast.…``,
``datetime.timedelta``), else a name seen from where the docstring is (its object's
members, then its class's and module's, the module's imports included), or, with a
leading dot, the object of the package whose path ends so (the nearest to the docstring).
The link text is the target as written (``~``: its last part; no leading dot), with ``()``
after a function or method, or the title of ``:meth:`title <target>```.

Where a found object is rendered is its public path, not where it is defined:
``emqfast.core.errors.ReplyLost`` is shown as ``emqfast.ReplyLost``, a member inherited
by ``emqfast.Queue`` as ``emqfast.Queue.<member>``. Then:

* a public name (``emqfast.__all__``, ``emqfast.aio.__all__``, ``emqfast.web.__all__``,
  ``PUBLIC_EXTRA``) is a required cross-reference: if the reference does not render it,
  the strict build fails;
* any other object of the package (a private helper, an internal module) is an optional
  one: a link where the reference renders it, else plain code;
* a target outside the package that Python can import (``datetime.datetime``) is plain code;
* a target that exists nowhere stays a required cross-reference to the name as written,
  so a docstring the reference renders with a stale role fails the build (mkdocs-autorefs:
  "Could not find cross-reference target").

``unresolved`` (module-level) collects the roles that name nothing, for the tests.

Registered in mkdocs.yml: ``plugins.mkdocstrings.handlers.python.options.extensions``.
"""
from __future__ import annotations

import builtins
import html
import importlib
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import griffe

PACKAGE = "emqfast"
# The modules whose __all__ names are public (each rendered by docs/reference.md).
PUBLIC_MODULES = ("emqfast", "emqfast.aio", "emqfast.web")
# Public names not re-exported by those: raised by the queue, documented in the reference.
PUBLIC_EXTRA = ("emqfast.errors.NotReplicated",)
ROLE = re.compile(r":(?P<role>class|meth|func|mod|data|attr|exc|obj):`(?P<body>[^`]+)`")
TITLED = re.compile(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
CALLABLE_ROLES = {"meth", "func"}

# (docstring owner's path, role text as written) for each role whose target is nowhere
unresolved: List[Tuple[str, str]] = []


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles into autorefs cross-references once the package is loaded.

    The options (mkdocs.yml, or a test's own site) default to emqfast's."""

    def __init__(self, package: str = PACKAGE, public_modules: Sequence[str] = PUBLIC_MODULES,
                 public_extra: Sequence[str] = PUBLIC_EXTRA):
        super().__init__()
        self.package = package
        self.public_modules = tuple(public_modules)
        self.public_extra = tuple(public_extra)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.name != self.package:
            return
        unresolved.clear()
        rewriter = Rewriter(pkg, loader.modules_collection, self.public_modules,
                            self.public_extra)
        for obj in _documented(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = rewriter.rewrite(obj)


def _documented(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined under it (not imports, not inherited members)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _documented(member)  # type: ignore[arg-type]


class Rewriter:
    def __init__(self, pkg: griffe.Module, collection: Any,
                 public_modules: Sequence[str] = PUBLIC_MODULES,
                 public_extra: Sequence[str] = PUBLIC_EXTRA):
        self.pkg = pkg
        self.collection = collection
        self.public_modules, self.public_extra = public_modules, public_extra
        self.public, self.required = self._public_paths()

    # --- where things are rendered ------------------------------------------------------
    def _public_paths(self) -> Tuple[Dict[str, str], Set[str]]:
        """Canonical path -> public path (a prefix map), and the public names themselves."""
        public: Dict[str, str] = {}
        required: Set[str] = set()
        for module_path in self.public_modules:
            module = self._lookup(module_path)
            if module is None:
                continue
            public.setdefault(self.canonical(module), module_path)
            for name in module.exports or ():
                member = self._member(module, str(name))
                if member is None:
                    continue
                path = f"{module_path}.{name}"
                required.add(path)
                # the first public name wins: emqfast.ReplyLost over emqfast.errors.ReplyLost
                public.setdefault(self.canonical(member), path)
        for path in self.public_extra:
            member = self._lookup(path)
            if member is not None:
                required.add(path)
                public.setdefault(self.canonical(member), path)
        return public, required

    def rendered(self, canonical: str) -> str:
        """The path under which the reference shows the object at ``canonical``."""
        head, tail = canonical, ""
        while head:
            if head in self.public:
                return self.public[head] + tail
            head, _, last = head.rpartition(".")
            tail = f".{last}{tail}"
        return canonical

    def canonical(self, obj: Any) -> str:
        """Where ``obj`` is defined; an inherited member: under the class that inherits it."""
        if obj.is_alias and obj.inherited:
            return f"{self.canonical(obj.parent)}.{obj.name}"
        if obj.is_alias:
            return str(obj.final_target.path)
        return str(obj.path)

    # --- finding a role's target --------------------------------------------------------
    def _lookup(self, path: str) -> Any:
        try:
            obj = self.collection[path]
            if obj.is_alias:
                obj.final_target  # an import of something not loaded: not found here
            return obj
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def _member(self, obj: Any, dotted: str) -> Any:
        try:
            member = obj[dotted]
            if member.is_alias:
                member.final_target
            return member
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def find(self, owner: griffe.Object, target: str) -> Tuple[Any, Optional[str]]:
        """(the package object, None) or (None, an importable outside path) or (None, None)."""
        if target.startswith("."):
            return self._by_suffix(owner, target[1:]), None
        first, _, rest = target.partition(".")
        scope: Any = owner
        while scope is not None:  # the owner's members, then its class's, its module's
            found = self._member(scope, first) if first in scope.all_members else None
            if found is None and scope.is_alias is False and scope.is_module is False \
                    and scope.name == first:
                found = scope
            if found is not None:
                return (self._member(found, rest) if rest else found), None
            if first in scope.all_members:  # an import from outside the package
                imported = scope.all_members[first].target_path + (f".{rest}" if rest else "")
                return None, self._outside(imported) or self._outside(target)
            scope = None if scope.is_module else scope.parent
        found = self._lookup(target)
        if found is not None:
            return found, None
        return None, self._outside(target)

    def _by_suffix(self, owner: griffe.Object, suffix: str) -> Any:
        """Sphinx's ``.name``: the object whose path ends with it, nearest the owner first."""
        matches = [obj for obj in _documented(self.pkg) if obj.path.endswith(f".{suffix}")]
        matches.sort(key=lambda obj: -len(_common_prefix(obj.path, owner.path)))
        return matches[0] if matches else None

    def _outside(self, path: str) -> Optional[str]:
        """``path`` if Python can import it (a module, or a name in one) and it is not ours."""
        if path.split(".")[0] == self.pkg.name:
            return None
        if "." not in path:
            if hasattr(builtins, path):
                return path
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                return None
            return path
        return None

    # --- writing the cross-reference ----------------------------------------------------
    def rewrite(self, owner: griffe.Object) -> str:
        assert owner.docstring is not None
        return ROLE.sub(lambda match: self._reference(owner, match), owner.docstring.value)

    def _reference(self, owner: griffe.Object, match: "re.Match[str]") -> str:
        role, body = match["role"], match["body"].strip()
        titled = TITLED.match(body)  # Sphinx's explicit title: ``title <target>``
        target = (titled["target"] if titled else body).lstrip("~!")
        if titled:
            text = titled["title"]
        else:
            text = target.lstrip(".")
            text = text.rpartition(".")[2] if body.startswith("~") else text
            text += "()" if role in CALLABLE_ROLES else ""
        code = f"<code>{html.escape(text)}</code>"
        if body.startswith("!"):  # Sphinx: no link wanted
            return code
        found, outside = self.find(owner, target)
        if found is None and outside is not None:
            return code
        if found is None:
            unresolved.append((owner.path, match.group(0)))
            return _autoref(target, code, owner, role, optional=False)
        path = self.rendered(self.canonical(found))
        return _autoref(path, code, owner, role, optional=path not in self.required)


def _autoref(identifier: str, title: str, owner: griffe.Object, role: str, *,
             optional: bool) -> str:
    """An mkdocs-autorefs reference; its origin and place name the docstring in a warning."""
    where = (f' domain="py" role="{role}" origin="{html.escape(owner.path)}"'
             f' filepath="{html.escape(str(owner.relative_filepath))}"'
             f' lineno="{owner.docstring.lineno if owner.docstring else 0}"')
    flag = " optional" if optional else ""
    return f'<autoref identifier="{html.escape(identifier)}"{flag}{where}>{title}</autoref>'


def _common_prefix(a: str, b: str) -> str:
    parts = []
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        parts.append(x)
    return ".".join(parts)
