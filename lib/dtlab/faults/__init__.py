"""Failure injection, detection and recovery (lab 10).

* :mod:`~dtlab.faults.inject` — :class:`Fault` (kill, hang, raise, slow at a chosen step).
* :mod:`~dtlab.faults.job` — the FSDP training job that checkpoints and resumes bit for bit.
* :mod:`~dtlab.faults.supervisor` — :func:`run_with_recovery`: detect, restart, resume
  (elastic: on fewer ranks).
* :mod:`~dtlab.faults.quorum` and :mod:`~dtlab.faults.replicas` — in-job recovery: replicas
  keep stepping while one is replaced from a healthy peer (torchft's idea).
* :mod:`~dtlab.faults.sdc` — silent data corruption: the cross-replica parameter checksum (sees a
  corrupted copy, not a compute error), the same-batch gradient check, planted bit flips.
* :mod:`~dtlab.faults.goodput` — goodput vs checkpoint interval on a simulated failure trace.
* :mod:`~dtlab.faults.timeouts` — collective timeouts: detection cost against false restarts,
  a long start-up and a short training timeout, what a timeout's dump must say.
* :mod:`~dtlab.faults.spares` — nodes out at once in a simulated fleet, against the Poisson tail
  that sizes a hot-spare pool (:func:`dtlab.cost.reliability.spare_pool_size`).
"""

from dtlab.faults.goodput import failure_trace, goodput_curve, replay
from dtlab.faults.inject import Fault, InjectedFault, fired_faults, maybe_fail
from dtlab.faults.job import JobSpec, job_config, train_with_checkpoints
from dtlab.faults.replicas import ReplicaSpec, train_replicas
from dtlab.faults.sdc import (
    compare_gradients,
    compare_replicas,
    flip_bit,
    parameter_checksums,
    wrong_output,
)
from dtlab.faults.spares import share_of_time_above, simulate_nodes_down
from dtlab.faults.supervisor import Attempt, Recovery, run_with_recovery

__all__ = [
    "Attempt",
    "Fault",
    "InjectedFault",
    "JobSpec",
    "Recovery",
    "ReplicaSpec",
    "compare_gradients",
    "compare_replicas",
    "failure_trace",
    "fired_faults",
    "flip_bit",
    "goodput_curve",
    "job_config",
    "maybe_fail",
    "parameter_checksums",
    "replay",
    "run_with_recovery",
    "share_of_time_above",
    "simulate_nodes_down",
    "train_replicas",
    "train_with_checkpoints",
    "wrong_output",
]
