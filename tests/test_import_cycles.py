"""Dependencies point downward (DESIGN): no two dtlab modules, and no two dtlab packages, import
each other — imports inside functions included.

Imports are read with ``ast`` from every ``lib/dtlab/**/*.py``, without importing any of them. An
edge ``a → b`` means that running ``a`` can run ``b``: ``import b``, ``from b import x``, and
``from pkg import b`` for a submodule ``b``; importing ``pkg.b`` also runs ``pkg/__init__.py``
(unless ``pkg`` encloses ``a``, whose import already started it). Imports under
``if TYPE_CHECKING:`` never run and are skipped. Every edge remembers the ``file:line`` that made
it, so a failure says where to look.

**The ``dtlab`` root is a facade**, left out of the package graph: ``dtlab/__init__.py``
re-exports names from the packages below it (``dtlab.rank`` is
:func:`dtlab.runtime.context.rank`, ``dtlab.Cluster`` is :class:`dtlab.runtime.Cluster`), and
nothing below needs the root for its own sake. ``import dtlab`` (or ``from dtlab import name``)
inside dtlab is therefore resolved to the package that *defines* each name it reaches
(``dtlab.device()`` in ``dtlab.faults`` is an edge ``dtlab.faults → dtlab.runtime``); a bare
``dtlab.__file__`` is no edge.

Three rules:

* **Module level** (run when the module is imported): no cycle of any length. Python then runs
  one module half-initialised, and which name is missing depends on who was imported first.
* **Modules, inside functions too**: no two modules import each other; deferring one import to
  a call only hides a loop that means one of the two is in the wrong place.
* **Packages, inside functions too**: the graph of dtlab's first-level packages and modules
  (``dtlab.quiz``, ``dtlab.workshop``, ``dtlab.runtime``, ``dtlab.config``, …; every module
  counted under its first-level package) has no cycle of any length. A cycle between packages is
  the same mistake one level up: the two halves cannot be read, tested or moved apart.

The package cycles this test found when it was written, and which way each was broken (the lower
package named first; :data:`LOWER_PACKAGES`): ``dtlab.trace`` and ``dtlab.memory`` sit below
``dtlab.runtime`` (the Cluster collects the spans; the recorder and the meters read
``torch.distributed`` themselves), ``dtlab.runtime`` below ``dtlab.mesh`` (a mesh is groups over
the runtime's ranks: :func:`dtlab.mesh.split_into_groups` moved up to it), and
``dtlab.workshop`` below ``dtlab.quiz`` (quiz links point into lab sources; the score export
over quiz progress records moved to :mod:`dtlab.quiz.scores`).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib"

# (lower, upper): the upper package may import the lower one, never the other way round.
LOWER_PACKAGES = [
    ("dtlab.trace", "dtlab.runtime"),
    ("dtlab.memory", "dtlab.runtime"),
    ("dtlab.runtime", "dtlab.mesh"),
    ("dtlab.workshop", "dtlab.quiz"),
]


@dataclass
class Edge:
    """``a`` imports ``b``: ``deferred`` when only inside functions; ``where`` as ``file:line``."""

    deferred: bool = True
    where: list[str] = field(default_factory=list)


Graph = dict[str, dict[str, Edge]]


def _modules(lib: Path, root: str = "dtlab") -> dict[str, Path]:
    found = {}
    for path in sorted((lib / root).rglob("*.py")):
        parts = list(path.relative_to(lib).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _facade_home(name: str) -> str | None:
    """The module that defines ``dtlab.<name>`` as the root facade exports it, or None."""
    dtlab = importlib.import_module("dtlab")
    value = getattr(dtlab, name, None)
    if isinstance(value, type(dtlab)):
        return value.__name__
    home = getattr(value, "__module__", None)
    return home if isinstance(home, str) and home.startswith("dtlab.") else None


def _imports(
    name: str,
    path: Path,
    modules: dict[str, Path],
    lib: Path,
    facade: Callable[[str], str | None],
) -> dict[str, Edge]:
    """Every dtlab module ``name`` imports, with whether only inside a function, and where."""
    edges: dict[str, Edge] = {}
    root = name.split(".")[0]
    enclosing = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    where_file = path.relative_to(lib).as_posix()
    binds_root = False

    def add(target: str, deferred: bool, line: int) -> None:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
            module = ".".join(parts[:i])
            if (
                module in modules
                and module != name
                and (module == target or module not in enclosing)
            ):
                edge = edges.setdefault(module, Edge())
                edge.deferred = edge.deferred and deferred
                edge.where.append(f"{where_file}:{line}")

    def add_root_name(attribute: str, deferred: bool, line: int) -> None:
        submodule = f"{root}.{attribute}"
        home = submodule if submodule in modules else facade(attribute)
        if home is not None:
            add(home, deferred, line)

    def visit(node: ast.AST, deferred: bool) -> None:
        nonlocal binds_root
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = deferred or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == root:
                        binds_root = binds_root or alias.asname is None
                    elif alias.name not in enclosing:
                        add(alias.name, inner, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        add(submodule, inner, child.lineno)
                    elif base == root:  # a name re-exported by the facade
                        add_root_name(alias.name, inner, child.lineno)
                    else:
                        add(base, inner, child.lineno)
            elif (
                isinstance(child, ast.Attribute)
                and isinstance(child.value, ast.Name)
                and child.value.id == root
            ):
                attributes.append((child.attr, inner, child.lineno))
            visit(child, inner)

    attributes: list[tuple[str, bool, int]] = []
    visit(ast.parse(path.read_text(), str(path)), False)
    if binds_root and name != root:
        for attribute, deferred, line in attributes:
            add_root_name(attribute, deferred, line)
    return edges


def _graph(
    lib: Path = LIB, root: str = "dtlab", facade: Callable[[str], str | None] = _facade_home
) -> Graph:
    modules = _modules(lib, root)
    return {name: _imports(name, path, modules, lib, facade) for name, path in modules.items()}


def _package_of(module: str) -> str:
    """``dtlab.quiz.graders.zero`` → ``dtlab.quiz``; ``dtlab.config`` → itself."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: Graph, root: str = "dtlab") -> Graph:
    """The first-level packages' graph, every import counted (inside functions too); the root
    facade left out."""
    packages: Graph = {}
    for module, edges in graph.items():
        if module == root:
            continue
        source = packages.setdefault(_package_of(module), {})
        for target, edge in edges.items():
            if target != root and _package_of(target) != _package_of(module):
                merged = source.setdefault(_package_of(target), Edge())
                merged.where += edge.where
    return packages


def _cycle_through(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := walk(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def _describe(cycle: list[str], graph: Graph) -> str:
    steps = [
        f"  {a} → {b}  ({', '.join(sorted(set(graph[a][b].where))[:3])})"
        for a, b in zip(cycle, cycle[1:], strict=False)
    ]
    return " → ".join(cycle) + "\n" + "\n".join(steps)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_import_reader_sees_imports_inside_functions_and_names_their_line(tmp_path):
    _write(tmp_path / "pkg/__init__.py", "")
    _write(tmp_path / "pkg/low/__init__.py", "")
    _write(tmp_path / "pkg/low/x.py", '"""low."""\n\n\ndef f():\n    from pkg.high import y\n')
    _write(tmp_path / "pkg/high/__init__.py", "")
    _write(tmp_path / "pkg/high/y.py", "from pkg.low import x\n")
    graph = _graph(tmp_path, "pkg", facade=lambda name: None)
    assert graph["pkg.low.x"]["pkg.high.y"].deferred is True
    assert graph["pkg.low.x"]["pkg.high.y"].where == ["pkg/low/x.py:5"]
    assert graph["pkg.high.y"]["pkg.low.x"].deferred is False
    packages = _package_graph(graph, "pkg")
    cycle = _cycle_through({a: set(edges) for a, edges in packages.items()})
    assert cycle == ["pkg.high", "pkg.low", "pkg.high"]
    assert "pkg/low/x.py:5" in _describe(cycle, packages)


def test_the_import_reader_resolves_the_dtlab_facade_to_the_defining_package():
    graph = _graph()
    assert graph["dtlab.quiz.graders.capstone"]["dtlab.plan"].deferred is False
    assert graph["dtlab.workshop.build"]["dtlab.workshop.source"].deferred is False
    # `import dtlab` … `dtlab.device()` inside a function reaches dtlab.runtime.context.
    assert graph["dtlab.faults.job"]["dtlab.runtime.context"].deferred is True
    packages = _package_graph(graph)
    assert "dtlab" not in packages
    assert "dtlab.runtime" in packages["dtlab.faults"]


def test_no_dtlab_modules_import_each_other_at_module_level():
    graph = _graph()
    module_level = {
        a: {b for b, edge in edges.items() if not edge.deferred} for a, edges in graph.items()
    }
    cycle = _cycle_through(module_level)
    assert cycle is None, (
        "module-level import cycle: " + _describe(cycle, graph) + "\nMove the shared piece into "
        "the module that belongs lower, or into a small module both can import."
    )


def test_no_two_dtlab_modules_import_each_other_even_inside_functions():
    graph = _graph()
    loops = sorted(
        (a, b) for a, edges in graph.items() for b in edges if a < b and a in graph.get(b, {})
    )
    assert not loops, "two modules import each other (inside a function counts):\n" + "\n".join(
        _describe([a, b, a], graph) for a, b in loops
    )


def test_no_dtlab_packages_import_each_other_even_inside_functions():
    packages = _package_graph(_graph())
    cycle = _cycle_through({a: set(edges) for a, edges in packages.items()})
    assert cycle is None, (
        "package import cycle: " + _describe(cycle, packages) + "\nDecide which package is "
        "lower (DESIGN: viz, quiz and notebooks use the mechanisms; mechanisms use comm, mesh, "
        "runtime, trace, memory) and move the shared piece down, or pass a callable in."
    )


def test_the_broken_package_cycles_stay_broken_in_their_chosen_direction():
    packages = _package_graph(_graph())
    upward = {
        f"{lower} → {upper}": sorted(set(packages[lower][upper].where))
        for lower, upper in LOWER_PACKAGES
        if upper in packages.get(lower, {})
    }
    assert not upward, f"a lower package imports the one above it: {upward}"
