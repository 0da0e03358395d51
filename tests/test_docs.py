"""The docs site: ``mkdocs build --strict`` succeeds (a broken link, a missing page, a
docstring mkdocstrings cannot render, a cross-reference to nothing fail it, ``--quiet``
or not), and every public name (``emqfast.__all__``, ``emqfast.aio.__all__``,
``emqfast.web.create_app``, ``emqfast.errors.NotReplicated``) has a docstring and an
entry in the API reference with its signature (a class: its constructor's parameters),
which the docstrings' Sphinx roles link to instead of showing ``:class:`` text.
Skipped only where mkdocs is not installed; ``.ci/run`` installs it (``make docs``), so
CI runs this."""
from __future__ import annotations

import enum
import html
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
import types
from typing import Any, Dict, List

import pytest

import emqfast
import emqfast.aio

pytest.importorskip("mkdocs", reason="the docs extra is not installed (make docs installs it)")
pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] not installed")
griffe = pytest.importorskip("griffe", reason="griffe comes with mkdocstrings[python]")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Plain values (strings) carry no docstring of their own: the reference describes them.
VALUES = {"emqfast.__version__", "emqfast.KEYSPACE_VERSION"}
PUBLIC = sorted([f"emqfast.{name}" for name in emqfast.__all__]
                + [f"emqfast.aio.{name}" for name in emqfast.aio.__all__]
                + ["emqfast.web.create_app", "emqfast.errors.NotReplicated"])
# Members that must have an entry of their own (inherited, so easily left out)
MEMBERS = ["emqfast.Worker.stats_by_queue", "emqfast.aio.Worker.stats_by_queue",
           "emqfast.Worker.stats", "emqfast.Worker.queues"]
ROLE_TEXT = re.compile(r":(class|meth|func|mod|data|attr|exc|obj):`?")
# Roles known to name nothing, in docstrings the reference does not render (the build
# would fail on them otherwise). Fix the docstring, then drop its line here.
STALE_ROLES: set = set()


def _mkdocs_build(cwd: str, site: str) -> subprocess.CompletedProcess:
    """``mkdocs build --strict --quiet`` (what ``make docs`` runs) of the site in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", site],
        cwd=cwd, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1",
             "PYTHONPATH": os.pathsep.join([cwd, ROOT, os.environ.get("PYTHONPATH", "")])})


@pytest.fixture(scope="module")
def reference_html(tmp_path_factory):
    """Build the whole site once, strictly, into a temporary directory."""
    site = tmp_path_factory.mktemp("site")
    built = _mkdocs_build(ROOT, str(site))
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    with open(site / "reference" / "index.html", encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def entries(reference_html) -> Dict[str, str]:
    """The reference's HTML cut at its headings: heading id -> its part of the page."""
    heads = [(m.start(), m.group(1))
             for m in re.finditer(r'<h[1-6] id="([^"]+)"', reference_html)]
    ends = [start for start, _ in heads[1:]] + [len(reference_html)]
    return {name: reference_html[start:end] for (start, name), end in zip(heads, ends)}


def _resolve(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if module == "emqfast.web":
        pytest.importorskip("starlette", reason="the web extra is not installed")
    return getattr(importlib.import_module(module), name)


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


@pytest.mark.parametrize("path", PUBLIC)
def test_public_name_has_a_docstring(path):
    obj = _resolve(path)
    if path in VALUES:
        assert isinstance(obj, str) and obj
        return
    doc = inspect.getdoc(obj)
    if isinstance(obj, types.ModuleType) or inspect.isclass(obj) or callable(obj):
        # a class's inherited docstring (e.g. Exception's) does not count
        own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else doc
        assert own and own.strip(), f"{path} has no docstring of its own"
    else:
        assert doc, f"{path} has no docstring"


def test_every_public_name_is_in_the_reference(entries):
    missing = [path for path in PUBLIC + MEMBERS if path not in entries]
    assert not missing, f"not in docs/reference.md: {missing}"


def test_reference_shows_the_docstrings(reference_html):
    """The rendered page carries each documented object's docstring (its first line)."""
    absent = []
    for path in sorted(set(PUBLIC) - VALUES):
        first = inspect.getdoc(_resolve(path)).strip().splitlines()[0]
        words = first.split()[:4]  # a few words: markup may split the rest
        if not all(_plain(word) in reference_html for word in words):
            absent.append((path, first))
    assert not absent, f"docstrings not shown in the reference: {absent}"


def _plain(word: str) -> str:
    """A docstring word as it appears in HTML text (markup and escapes aside)."""
    word = re.sub(r":[a-z]+:`~?(?:[\w.]*\.)?(\w+)`", r"\1", word)  # a role: its link text
    for mark in ("``", "`", "*"):
        word = word.replace(mark, "")
    return word.strip(".,:;()").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _parameters(obj: Any) -> List[str]:
    """The parameter names a call of ``obj`` takes, as a signature shows them."""
    if inspect.isclass(obj) and issubclass(obj, BaseException) and not any(
            "__init__" in vars(k) for k in obj.__mro__ if k.__module__.startswith("emqfast")):
        return ["*args"]  # Exception's own constructor
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in inspect.signature(obj).parameters.values()]


@pytest.mark.parametrize("path", [p for p in PUBLIC if p not in VALUES])
def test_reference_shows_the_signature(path, entries):
    """Each public class shows its constructor (merged into the class), each function its
    parameters: every one of them, by name, in the entry's signature."""
    obj = _resolve(path)
    if isinstance(obj, types.ModuleType) or (inspect.isclass(obj) and issubclass(obj, enum.Enum)):
        return  # a module, an enum's values: nothing to call
    found = re.search(r'<div class="doc-signature highlight">(.*?)</pre>', entries[path], re.S)
    assert found, f"{path}: no signature in the reference"
    signature = _text(found.group(1))
    name = path.rpartition(".")[2]
    assert signature.lstrip().startswith(f"{name}("), f"{path}: signature is {signature!r}"
    missing = [p for p in _parameters(obj)
               if not re.search(rf"(?<![\w*]){re.escape(p)}\s*[:=,)]", signature)]
    assert not missing, f"{path}: parameters {missing} not in its signature {signature!r}"


def test_no_sphinx_role_text_in_the_reference(reference_html):
    body = _text(reference_html.split('<article', 1)[-1])
    leftover = sorted({m.group(0) + body[m.end():m.end() + 40].split("`")[0]
                       for m in ROLE_TEXT.finditer(body)})
    assert not leftover, f"Sphinx roles shown as text: {leftover[:20]}"
    assert "&lt;autoref" not in reference_html, "a cross-reference shown as text (in code?)"


def test_roles_link_to_the_public_entries(reference_html):
    """A role naming a public object, however spelled (``~emqfast.errors.PermissionDenied``,
    a re-export of ``emqfast.core.errors``), links to its one entry."""
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="#([^"]+)"',
                       reference_html)
    assert len(links) > 100, "the reference's docstrings link to few entries"
    assert "emqfast.PermissionDenied" in links and "emqfast.errors.NotReplicated" in links
    # an optional reference not rendered is a <span title=path>: never a public name
    unlinked = set(re.findall(r'<span title="([^"]+)"><code>', reference_html))
    assert not unlinked & set(PUBLIC), sorted(unlinked & set(PUBLIC))


def test_every_role_names_something():
    """Every role in the package's docstrings names an object (of the package, or one
    Python can import), also where the reference does not render it yet."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import griffe_roles
    finally:
        sys.path.pop(0)
    griffe.load("emqfast", search_paths=[ROOT], resolve_aliases=False,
                extensions=griffe.load_extensions(griffe_roles.SphinxRoles()))
    stale = set(griffe_roles.unresolved) - STALE_ROLES
    assert not stale, f"roles naming nothing (docstring's object, role): {sorted(stale)}"


PROBE_PACKAGE = '''
"""A package for the docs build's own test."""
__all__ = ["Thing", "Other"]


class Other:
    """Another public class."""


class Thing:
    """Made of :class:`Other` (a link), :meth:`_hidden` (private: code); {extra}"""

    def __init__(self, size: int, *, name: str = "x"):
        pass

    def _hidden(self):
        pass
'''

PROBE_SITE = '''
site_name: probe
docs_dir: docs
theme:
  name: material
hooks:
  - {root}/scripts/mkdocs_strict.py
plugins:
  - mkdocstrings:
      handlers:
        python:
          paths: ["."]
          options:
            extensions:
              - {root}/scripts/griffe_roles.py:SphinxRoles:
                  package: probepkg
                  public_modules: [probepkg]
                  public_extra: []
            merge_init_into_class: true
            show_signature: true
            docstring_style: null
'''


@pytest.mark.parametrize("extra, fails", [
    (":class:`datetime.timedelta` (outside: code).", False),
    (":class:`~probepkg.Missing` (nothing: the build fails).", True),
])
def test_a_role_naming_nothing_fails_the_build(tmp_path, extra, fails):
    """The strict, quiet build of a small site with the same extension and hook: a role
    to nothing fails it (naming the target); private and outside targets are code."""
    (tmp_path / "probepkg").mkdir()
    (tmp_path / "probepkg" / "__init__.py").write_text(
        textwrap.dedent(PROBE_PACKAGE).replace("{extra}", extra))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("::: probepkg.Thing\n\n::: probepkg.Other\n")
    (tmp_path / "mkdocs.yml").write_text(PROBE_SITE.format(root=ROOT))
    built = _mkdocs_build(str(tmp_path), str(tmp_path / "site"))
    if fails:
        assert built.returncode != 0
        assert "Could not find cross-reference target 'probepkg.Missing'" in built.stderr
        return
    assert built.returncode == 0, built.stderr[-3000:]
    page = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'href="#probepkg\.Other"[^>]*><code>Other</code></a>', page)
    assert '<span title="probepkg.Thing._hidden"><code>_hidden()</code></span>' in page
    assert "<code>datetime.timedelta</code>" in page and ":class:" not in page
