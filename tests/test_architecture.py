"""The package's layout is part of its contract (docs/ARCHITECTURE.md): layers import
only downward, no module imports itself round a circle, and modules and functions stay
small enough to read. These tests read the source (imports via ``ast``), so a change
that breaks the rule fails here before it becomes the next engineer's tangle."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "emqfast"
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"

# Lowest first. A module may import its own layer and the layers before it, never after.
LAYERS = ["core", "server", "backends", "facade", "worker", "aio", "api", "tools"]
FOLDER_LAYERS = {"web": "tools"}  # folders of a layer named otherwise (the dashboard: a tool)
ROOT_MODULES = {"emqfast": "api", "emqfast.__main__": "tools"}
# A module holds one cohesive thing: a class is kept whole (the Worker read top to bottom)
# rather than spread over mixins to fit a smaller limit; functions stay short.
MAX_MODULE_LINES = 900
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: Dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    if module in ROOT_MODULES:
        return ROOT_MODULES[module]
    layer = FOLDER_LAYERS.get(module.split(".")[1], module.split(".")[1])
    assert layer in LAYERS, f"{module} is in no layer: put it in one of {LAYERS}"
    return layer


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _target(name: str) -> Optional[str]:
    """The emqfast module ``name`` stands for (a module, or the module holding a symbol)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, type_checking: bool = False) -> Set[str]:
    """The emqfast modules ``module`` imports at run time (top level or inside functions);
    ``type_checking``: also those imported only for type checkers."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: Set[str] = set()
    tree = ast.parse(path.read_text())
    for node in (ast.walk(tree) if type_checking else _runtime_nodes(tree)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            target = _target(name) if name.startswith("emqfast") else None
            if target and target != module:
                found.add(target)
    # importing a.b.c imports its packages a and a.b too: only the module itself counts
    return {m for m in found if not (MODULES[m].name == "__init__.py" and
                                     any(o.startswith(m + ".") for o in found))}


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_sits_in_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_down(module):
    mine = LAYERS.index(layer_of(module))
    upward = [m for m in sorted(GRAPH[module]) if LAYERS.index(layer_of(m)) > mine]
    assert not upward, (f"{module} ({layer_of(module)}) imports a higher layer: {upward}; "
                        f"the order is {' <- '.join(LAYERS)}")


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles(GRAPH) == []


def test_no_import_circles_even_through_type_checking_imports():
    """A circle only type checkers follow is still a tangle: two modules that each need the
    other to be read."""
    assert _cycles({m: imports_of(m, type_checking=True) for m in MODULES}) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_upward_import_would_be_seen():
    tree_text = "def f():\n    from emqfast.tools import cli\n"
    nodes = list(_runtime_nodes(ast.parse(tree_text)))
    assert any(isinstance(n, ast.ImportFrom) and n.module == "emqfast.tools" for n in nodes)


def _justified() -> Set[str]:
    """Names listed in ARCHITECTURE.md's "Size exceptions" section (``module`` or
    ``module:function``), each with its reason."""
    text = ARCHITECTURE.read_text()
    section = text.split("## Size exceptions", 1)[1] if "## Size exceptions" in text else ""
    section = section.split("\n## ", 1)[0]
    return set(re.findall(r"^\|\s*`([\w.:]+)`\s*\|", section, re.M))


def _long_functions(module: str) -> Iterator[Tuple[str, int]]:
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield node.name, length


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_functions_stay_small(module):
    allowed = _justified()
    lines = MODULES[module].read_text().count("\n")
    if module not in allowed:
        assert lines <= MAX_MODULE_LINES, (
            f"{module} has {lines} lines (> {MAX_MODULE_LINES}): split it by concern, or "
            "justify it under 'Size exceptions' in docs/ARCHITECTURE.md")
    for name, length in _long_functions(module):
        assert f"{module}:{name}" in allowed, (
            f"{module}:{name} is {length} lines (> {MAX_FUNCTION_LINES})")


def test_the_documented_layers_are_the_tested_ones():
    text = ARCHITECTURE.read_text()
    for layer in LAYERS:
        if layer != "api":
            assert f" {layer}/ " in text, f"ARCHITECTURE.md's diagram does not show {layer}/"
    for folder in (p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        assert folder in LAYERS or folder in FOLDER_LAYERS, \
            f"emqfast/{folder}/ is not a layer in this test"
        assert f" {folder}/ " in text, f"ARCHITECTURE.md's diagram does not show {folder}/"


@pytest.mark.parametrize("path", sorted((PACKAGE.parent / "lua").rglob("*.lua")), ids=lambda p: p.name)
def test_lua_reads_at_100_columns(path):
    long = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 100]
    assert not long, f"{path.name}: lines over 100 columns: {long} (wrap the header or comment)"


# The sources say what the code does; its history (which tracker item asked for what) lives in
# the commit log. CHANGELOG.md and BENCHMARKS.md's dated runs are history and are not read;
# neither is vendored code, which keeps its upstream's comments.
ROOT = PACKAGE.parent
HISTORY_FREE_DIRS = ["emqfast", "lua", "csrc", "tests", "bench", "scripts", "docs"]
HISTORY_FREE_FILES = ["README.md", "Makefile", "pyproject.toml", "setup.py", "mkdocs.yml"]
TEXT_SUFFIXES = {".py", ".pyi", ".lua", ".c", ".h", ".sh", ".md", ".html", ".js", ".css",
                 ".toml", ".yml", ".yaml", ".cfg", ".txt", ".in"}
ISSUE_TAG = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def _history_free_sources() -> List[Path]:
    found = [ROOT / name for name in HISTORY_FREE_FILES if (ROOT / name).exists()]
    for folder in HISTORY_FREE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if (path.is_file() and path.suffix in TEXT_SUFFIXES and "vendor" not in parts
                    and "__pycache__" not in parts):
                found.append(path)
    return found


def _issue_tags(text: str) -> List[Tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if ISSUE_TAG.search(line)]


def test_no_issue_tags_in_code_tests_bench_scripts_or_docs():
    tagged = [f"{path.relative_to(ROOT)}:{n}: {line}"
              for path in _history_free_sources()
              for n, line in _issue_tags(path.read_text(encoding="utf-8", errors="replace"))]
    assert not tagged, ("say what the code does, not which issue asked for it (the commit log "
                        "keeps that):\n" + "\n".join(tagged))


def test_the_issue_tag_scan_sees_tests_bench_and_scripts_and_finds_a_tag():
    scanned = {path.relative_to(ROOT).parts[0] for path in _history_free_sources()}
    assert {"emqfast", "tests", "bench", "scripts"} <= scanned
    tag = "Iss" + "ue 12"  # spelled apart so this file does not carry one itself
    assert _issue_tags(f"x = 1\n# {tag}: a note\n\"\"\"({tag.lower()}'s fast path)\"\"\"\n") == [
        (2, f"# {tag}: a note"), (3, f"\"\"\"({tag.lower()}'s fast path)\"\"\"")]
    assert _issue_tags("see " + "iss" + "ue #43") and not _issue_tags("an issue with 3 jobs")
