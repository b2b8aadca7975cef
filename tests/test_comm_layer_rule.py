"""Every byte a parallel family moves, and every group it builds, goes through ``dtlab.comm``.

DESIGN: "A parallel layer never calls ``torch.distributed`` directly, not even for a scalar
report". The communication layer is where bytes are counted and spans recorded; a direct
``dist.all_reduce`` in ``lib/dtlab/parallel`` is traffic no accounting test sees, and a direct
``dist.new_group`` is a group the mesh does not know. This test reads every
``lib/dtlab/parallel/**/*.py`` with ``ast`` (nothing is imported) and fails on any reference to a
``torch.distributed`` collective, point-to-point call or group constructor, however it was
imported: ``import torch.distributed as dist``, ``import torch``, ``from torch import
distributed``, ``from torch.distributed import all_reduce``, at module level or inside a
function. Queries (``get_rank``, ``get_world_size``, ``is_initialized``, …) and types
(``ProcessGroup``, ``ReduceOp``) stay allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib" / "dtlab"
PARALLEL = LIB / "parallel"

FORBIDDEN = {
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp", "send_object_list",
    "recv_object_list", "barrier", "monitored_barrier", "reduce", "gather", "scatter",
    "gather_object", "scatter_object_list", "new_group",
}  # fmt: skip
FORBIDDEN_PREFIXES = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "new_subgroups",
)  # fmt: skip


def _forbidden(name: str) -> bool:
    return name in FORBIDDEN or name.startswith(FORBIDDEN_PREFIXES)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def direct_distributed_calls(source: str, filename: str = "<source>") -> list[str]:
    """``"line: what"`` for every reference to a forbidden ``torch.distributed`` function in
    ``source``. Imports anywhere in the file (a function-local one too) bind their names for the
    whole file: an over-approximation that can only make the test stricter."""
    tree = ast.parse(source, filename)
    modules: dict[str, str] = {}  # local name → the module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:  # `import torch.distributed` binds `torch`
                    root = alias.name.split(".")[0]
                    modules[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full.startswith("torch.distributed") and _forbidden(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                modules[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        full = f"{modules.get(head, head)}.{rest}" if rest else modules.get(head, head)
        if full.startswith("torch.distributed.") and _forbidden(node.attr):
            found.append(f"{node.lineno}: {dotted}")
    return sorted(set(found), key=lambda f: int(f.split(":")[0]))


# What a parallel family may take from below the layer: the record type and the mismatch error.
COLLECTIVES_ALLOWED = {"dtlab.collectives.stats", "dtlab.collectives.agreement"}
# Group construction that lives in the runtime for the labs, not for the parallel families.
RUNTIME_GROUPS = {"group_of", "split_into_groups", "cached_groups", "barrier"}


def reaches_under_the_layer(source: str, filename: str = "<source>") -> list[str]:
    """``"line: what"`` for every import of dtlab's p2p layer or collectives (anything in
    :mod:`dtlab.collectives` but its stats record and mismatch error) and for every use of the
    runtime's group builders, anywhere in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dtlab.collectives") and not any(
                    alias.name.startswith(ok) for ok in COLLECTIVES_ALLOWED
                ):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module, names = node.module, [a.name for a in node.names]
            if module == "dtlab" and "collectives" in names:
                found.append(f"{node.lineno}: from dtlab import collectives")
            if module.startswith("dtlab.collectives") and not any(
                module.startswith(ok) for ok in COLLECTIVES_ALLOWED
            ):
                found.append(f"{node.lineno}: from {module} import {', '.join(names)}")
            if module.startswith(("dtlab.runtime", "dtlab")) and RUNTIME_GROUPS & set(names):
                found.append(f"{node.lineno}: from {module} import {', '.join(names)}")
        elif isinstance(node, ast.Attribute) and node.attr in RUNTIME_GROUPS:
            dotted = _dotted(node) or ""
            if dotted.startswith(("dtlab.", "context.")):
                found.append(f"{node.lineno}: {dotted}")
    return found


def test_no_parallel_family_reaches_under_the_layer_into_p2p_or_the_runtimes_groups():
    """Ring attention used to post on ``collectives.Peers`` and count its own bytes, and the
    pipeline took its embedding group from ``runtime.context.group_of``: both now ask
    :class:`~dtlab.comm.Communicator` (``start_exchange``, ``among``)."""
    offenders = {
        str(path.relative_to(LIB.parent)): hits
        for path in sorted(PARALLEL.rglob("*.py"))
        if (hits := reaches_under_the_layer(path.read_text(), str(path)))
    }
    assert not offenders, (
        "lib/dtlab/parallel reaches under the communication layer; use dtlab.comm instead:\n"
        + "\n".join(f"  {path}: {hits}" for path, hits in offenders.items())
    )


def test_the_under_the_layer_walker_catches_peers_and_group_of():
    ring = "from dtlab import collectives as C\n\ndef f(comm):\n    return C.peers_of(comm.ranks)\n"
    assert reaches_under_the_layer(ring) == ["1: from dtlab import collectives"]
    p2p = "def f():\n    from dtlab.collectives.p2p import Peers\n"
    assert reaches_under_the_layer(p2p) == ["2: from dtlab.collectives.p2p import Peers"]
    groups = "def f():\n    from dtlab.runtime.context import group_of\n"
    assert reaches_under_the_layer(groups) == ["2: from dtlab.runtime.context import group_of"]
    facade = "import dtlab\ng = dtlab.group_of([0, 1])\n"
    assert reaches_under_the_layer(facade) == ["2: dtlab.group_of"]
    fine = (
        "from dtlab.collectives.stats import CommStats\n"
        "from dtlab.collectives.agreement import CollectiveMismatch\n"
        "from dtlab.runtime.context import rank\n"
    )
    assert reaches_under_the_layer(fine) == []


def test_no_parallel_family_calls_torch_distributed_to_move_bytes_or_build_groups():
    files = sorted(PARALLEL.rglob("*.py"))
    assert len(files) > 40, f"expected the parallel families under {PARALLEL}"
    offenders = {
        str(path.relative_to(LIB.parent)): hits
        for path in files
        if (hits := direct_distributed_calls(path.read_text(), str(path)))
    }
    assert not offenders, (
        "lib/dtlab/parallel calls torch.distributed directly; route it through dtlab.comm "
        "(Communicator.all_reduce / send / start_exchange, all_reduce_control for a scalar "
        "report, Communicator.among or group_containing for a group):\n"
        + "\n".join(f"  {path}: {hits}" for path, hits in offenders.items())
    )


def test_the_walker_sees_the_communication_layers_own_calls():
    """A positive control on real code: the layer itself is where the calls live."""
    hits = direct_distributed_calls((LIB / "comm" / "communicator.py").read_text())
    assert any("dist.all_reduce" in h for h in hits)
    messages = direct_distributed_calls((LIB / "comm" / "messages.py").read_text())
    assert any("dist.recv" in h for h in messages)
    assert direct_distributed_calls((LIB / "comm" / "groups.py").read_text())


def test_the_walker_catches_aliases_function_local_imports_and_from_imports():
    aliased = "import torch.distributed as d\n\ndef f(x):\n    d.all_reduce(x)\n"
    assert direct_distributed_calls(aliased) == ["4: d.all_reduce"]
    local = "def f(x):\n    import torch.distributed as dist\n    dist.send(x, 1)\n"
    assert direct_distributed_calls(local) == ["3: dist.send"]
    through_torch = "import torch\n\ndef f():\n    torch.distributed.new_group([0, 1])\n"
    assert direct_distributed_calls(through_torch) == ["4: torch.distributed.new_group"]
    from_torch = "from torch import distributed as td\ntd.new_subgroups_by_enumeration([[0]])\n"
    assert direct_distributed_calls(from_torch) == ["2: td.new_subgroups_by_enumeration"]
    named = "def f(x):\n    from torch.distributed import all_gather_into_tensor as ag\n"
    assert direct_distributed_calls(named) == [
        "2: from torch.distributed import all_gather_into_tensor"
    ]
    held = "import torch.distributed as dist\ncall = dist.isend\n"
    assert direct_distributed_calls(held) == ["2: dist.isend"]
    c10d = "import torch.distributed.distributed_c10d as c10d\nc10d.broadcast(x, 0)\n"
    assert direct_distributed_calls(c10d) == ["2: c10d.broadcast"]


def test_queries_and_types_stay_allowed():
    allowed = (
        "import torch.distributed as dist\n"
        "def f(group: dist.ProcessGroup | None = None):\n"
        "    op = dist.ReduceOp.SUM\n"
        "    return dist.get_rank(group), dist.get_world_size(), dist.is_initialized(), op\n"
        "from torch.distributed.tensor.parallel import parallelize_module\n"
    )
    assert direct_distributed_calls(allowed) == []
    other = "import mylib as dist\ndist.all_reduce(1)\n"  # not torch's
    assert direct_distributed_calls(other) == []
