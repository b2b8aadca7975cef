"""dtlab: a hands-on lab for distributed deep-learning training.

Start here::

    import dtlab
    with dtlab.Cluster(4) as cluster:          # four real ranks, process group kept warm
        out = cluster.run(my_fn, x=3)          # my_fn runs on every rank; results in rank order
        out.trace                              # the spans each rank recorded, clocks aligned

Inside a function run on the cluster (or under ``torchrun``), ``dtlab.rank()``,
``dtlab.world_size()`` and ``dtlab.device()`` say who and where this rank is.
"""

from dtlab.mesh.mesh import split_into_groups
from dtlab.runtime.context import (
    barrier,
    device,
    group_of,
    is_distributed,
    local_rank,
    rank,
    world_size,
)

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "RankError",
    "ClusterTimeout",
    "UnfinishedWork",
    "launch",
    "rank",
    "world_size",
    "local_rank",
    "device",
    "barrier",
    "group_of",
    "split_into_groups",
    "is_distributed",
    "__version__",
]


_SUBMODULES = {
    "checkpoint",
    "collectives",
    "comm",
    "config",
    "cost",
    "faults",
    "memory",
    "mesh",
    "models",
    "parallel",
    "plan",
    "precision",
    "progress",
    "quiz",
    "trace",
    "viz",
    "workshop",
}


def __getattr__(name: str):
    # Submodules and the Cluster load on first use, so `import dtlab` stays quick.
    runtime_names = ("Cluster", "RankError", "ClusterTimeout", "RankDied", "UnfinishedWork")
    if name in (*runtime_names, "launch", "RunResult"):
        from dtlab import runtime

        return getattr(runtime, name)
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"dtlab.{name}")
    raise AttributeError(f"module 'dtlab' has no attribute {name!r}")
