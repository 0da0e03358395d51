"""The docs site (issue 17): ``mkdocs build --strict`` succeeds (a broken link, a missing
page, a docstring mkdocstrings cannot render fail it), and every public name of
``emqfast.__all__`` has a docstring that the API reference shows. Skipped only where mkdocs
is not installed; ``.ci/run`` installs it (``make docs``), so CI runs this."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types

import pytest

import emqfast

pytest.importorskip("mkdocs", reason="the docs extra is not installed (make docs installs it)")
pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Plain values (strings) carry no docstring of their own: the reference describes them.
VALUES = {"__version__", "KEYSPACE_VERSION"}


@pytest.fixture(scope="module")
def reference_html(tmp_path_factory):
    """Build the whole site once, strictly, into a temporary directory."""
    site = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    with open(site / "reference" / "index.html", encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("name", sorted(emqfast.__all__))
def test_public_name_has_a_docstring(name):
    obj = getattr(emqfast, name)
    if name in VALUES:
        assert isinstance(obj, str) and obj
        return
    doc = inspect.getdoc(obj)
    if isinstance(obj, types.ModuleType) or inspect.isclass(obj) or callable(obj):
        # a class's inherited docstring (e.g. Exception's) does not count
        own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else doc
        assert own and own.strip(), f"emqfast.{name} has no docstring of its own"
    else:
        assert doc, f"emqfast.{name} has no docstring"


def test_every_public_name_is_in_the_reference(reference_html):
    missing = [name for name in emqfast.__all__ if f'id="emqfast.{name}"' not in reference_html]
    assert not missing, f"not in docs/reference.md: {missing}"


def test_reference_shows_the_docstrings(reference_html):
    """The rendered page carries each documented object's docstring (its first line)."""
    absent = []
    for name in sorted(set(emqfast.__all__) - VALUES):
        first = inspect.getdoc(getattr(emqfast, name)).strip().splitlines()[0]
        words = first.split()[:4]  # a few words: markup may split the rest
        if not all(_plain(word) in reference_html for word in words):
            absent.append((name, first))
    assert not absent, f"docstrings not shown in the reference: {absent}"


def _plain(word: str) -> str:
    """A docstring word as it appears in HTML text (markup and escapes aside)."""
    for mark in ("``", "`", "*", ":class:", ":func:", ":meth:", ":mod:", "~"):
        word = word.replace(mark, "")
    return word.strip(".,:;()").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
