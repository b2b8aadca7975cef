"""The runtime: a warm pool of rank processes (the Cluster) and start-up under torchrun."""

from dtlab.runtime.cluster import Cluster, RunResult
from dtlab.runtime.errors import (
    ClusterError,
    ClusterTimeout,
    RankDied,
    RankError,
    ResultNotPicklable,
    UnfinishedWork,
)
from dtlab.runtime.torchrun import init_from_env, launch, running_under_torchrun

__all__ = [
    "Cluster",
    "RunResult",
    "ClusterError",
    "ClusterTimeout",
    "RankDied",
    "RankError",
    "ResultNotPicklable",
    "UnfinishedWork",
    "launch",
    "init_from_env",
    "running_under_torchrun",
]
