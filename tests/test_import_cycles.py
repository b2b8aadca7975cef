"""No two dtlab modules import each other (DESIGN: dependencies point downward).

Imports are read with ``ast`` from every ``lib/dtlab/**/*.py``, without importing anything. An
edge ``a → b`` means that running ``a`` can run ``b``: ``import b``, ``from b import x``, and
``from pkg import b`` for a submodule ``b``; importing ``pkg.b`` also runs ``pkg/__init__.py``
(unless ``pkg`` encloses ``a``, whose import already started it). Imports under
``if TYPE_CHECKING:`` never run and are skipped; ``import dtlab`` inside dtlab only binds the
package that is already importing.

* **Module level** (run when the module is imported): no cycle of any length. Python then runs
  one module half-initialised, and which name is missing depends on who was imported first.
* **Function level** (deferred until a call): no two modules may import each other either —
  the deferral only hides a loop that means one of the two is in the wrong place. The loops
  this issue did not reach are listed in :data:`KNOWN_FUNCTION_LEVEL_LOOPS`, and the test fails
  when one is gone so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib"

# Loops between two modules through imports inside functions, outside the files issue #12 split.
KNOWN_FUNCTION_LEVEL_LOOPS: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((LIB / "dtlab").rglob("*.py")):
        parts = list(path.relative_to(LIB).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, bool]:
    """Every dtlab module ``name`` imports → whether only inside a function (deferred)."""
    edges: dict[str, bool] = {}
    enclosing = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def add(target: str, deferred: bool) -> None:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
            module = ".".join(parts[:i])
            if (
                module in modules
                and module != name
                and (module == target or module not in enclosing)
            ):
                edges[module] = edges.get(module, True) and deferred

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = deferred or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name not in enclosing:
                        add(alias.name, inner)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                submodules = [
                    f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in modules
                ]
                for submodule in submodules:
                    add(submodule, inner)
                if len(submodules) < len(child.names):
                    add(base, inner)
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return edges


def _graph() -> dict[str, dict[str, bool]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle_through(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := walk(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := walk(module)):
            return found
    return None


def test_the_import_reader_sees_a_known_module_level_edge():
    graph = _graph()
    assert graph["dtlab.quiz.graders.capstone"]["dtlab.plan"] is False
    assert graph["dtlab.workshop.build"]["dtlab.workshop.exercises"] is False


def test_no_dtlab_modules_import_each_other_at_module_level():
    graph = _graph()
    module_level = {
        a: {b for b, deferred in edges.items() if not deferred} for a, edges in graph.items()
    }
    cycle = _cycle_through(module_level)
    assert cycle is None, (
        "module-level import cycle: " + " → ".join(cycle) + ". Move the shared piece into the "
        "module that belongs lower, or into a small module both can import."
    )


def test_no_two_dtlab_modules_import_each_other_even_inside_functions():
    graph = _graph()
    loops = {(a, b) for a, edges in graph.items() for b in edges if a < b and a in graph.get(b, {})}
    new = loops - KNOWN_FUNCTION_LEVEL_LOOPS
    assert not new, "two modules import each other (inside a function counts): " + "; ".join(
        f"{a} ↔ {b}" for a, b in sorted(new)
    )
    gone = KNOWN_FUNCTION_LEVEL_LOOPS - loops
    assert not gone, f"fixed, well done: remove {sorted(gone)} from KNOWN_FUNCTION_LEVEL_LOOPS"
