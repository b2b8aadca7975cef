"""Moving weights between jobs: trainer → inference engine in RL post-training, and local SGD.

**RL weight sync.** In on-policy RL post-training (PPO, GRPO) a separate inference engine (vLLM,
SGLang) generates rollouts with the latest policy, so after every optimizer step (or every few)
the trainer's weights must reach it: ``P × bytes`` per sync, BF16 for 2 B/param, resharded from
the trainer's layout (FSDP/TP shards) to the engine's (its TP degree). Systems broadcast over a
NCCL group spanning trainer and engine ranks (OpenRLHF, veRL), or colocate both on the same
GPUs and hand over in device memory. :func:`weight_sync_seconds` prices the transfer at the
bandwidth of the path used.

**Three ways to move them** (:mod:`dtlab.checkpoint.weight_sync` runs each on ranks, counted):
a *rank-0 funnel* (gather the shards to trainer 0, send a whole copy to each of the ``I`` engine
ranks: trainer 0 sends ``I·P·b``), *gather + broadcast* (one pipelined broadcast from trainer 0
over a group spanning both jobs: ``P·b`` per link), and *resharded point to point* (each trainer
sends each engine rank only the overlap of their shards: ``P·b`` in all, ``P·b/T`` per trainer).
:func:`weight_sync_bytes` gives the busiest sender's and the total bytes of each.

**Colocated or disaggregated, and staleness.** Colocated (trainer and engine time-share the same
GPUs, veRL's hybrid engine) the weights move in device memory, but generation and training
alternate: a step lasts ``train + generate``. Disaggregated (separate GPUs) they can overlap if
the engine generates with weights one step old (one-step off-policy, as in asynchronous RL):
``max(train, generate) + sync``, at the price of rollouts ``k`` policy versions stale; strictly
on-policy, they still alternate and the sync adds to it: :func:`rl_step_seconds`.

**Local SGD / DiLoCo.** Each data-parallel replica takes ``H`` optimizer steps on its own, then
the replicas average the change (the *pseudo-gradient*) and an outer optimizer applies it
(DiLoCo: AdamW inside, Nesterov momentum outside; Douillard et al. 2023, "DiLoCo: Distributed
Low-Communication Training of Language Models"; local SGD: Stich 2019, Lin et al. 2020). The
all-reduce happens once per ``H`` steps: :func:`local_sgd_bytes_per_step`.
"""

from __future__ import annotations


def weight_sync_seconds(
    num_params: float, bandwidth_bytes_per_s: float, bytes_per_param: float = 2
) -> float:
    """Seconds to move one copy of the weights at ``bandwidth_bytes_per_s``."""
    if num_params <= 0 or bandwidth_bytes_per_s <= 0 or bytes_per_param <= 0:
        raise ValueError("parameters, bandwidth and bytes per parameter must all be > 0")
    return num_params * bytes_per_param / bandwidth_bytes_per_s


def local_sgd_bytes_per_step(
    num_params: float, dp: int, inner_steps: int, bytes_per_elem: float = 4
) -> float:
    """Bytes each rank sends per inner step: one ring all-reduce of the pseudo-gradient,
    ``2(dp-1)/dp · P · b``, every ``inner_steps`` steps."""
    if num_params <= 0 or dp < 1 or inner_steps < 1 or bytes_per_elem <= 0:
        raise ValueError("need num_params > 0, dp >= 1, inner_steps >= 1, bytes_per_elem > 0")
    return 2 * (dp - 1) / dp * num_params * bytes_per_elem / inner_steps


SYNC_METHODS = ("funnel", "broadcast", "reshard")


def weight_sync_bytes(
    num_params: float, trainers: int, engines: int, method: str, bytes_per_param: float = 2
) -> dict[str, float]:
    """Bytes of one trainer → engine sync (``P`` params, ``T`` trainer ranks holding flat shards,
    ``I`` engine ranks): ``{"busiest_sender": ..., "total": ...}``.

    funnel:    gather ``(T−1)/T·P·b`` to trainer 0, which sends ``I·P·b`` → busiest ``I·P·b``;
    broadcast: the same gather, then a chain broadcast over ``1 + I`` ranks: ``I`` of them each
               forward ``P·b`` → busiest ``P·b``;
    reshard:   each trainer sends its whole shard once, split among engines → busiest ``P·b/T``,
               total ``P·b``.
    """
    if method not in SYNC_METHODS:
        raise ValueError(f"method={method!r}: choose one of {SYNC_METHODS}")
    if num_params <= 0 or trainers < 1 or engines < 1 or bytes_per_param <= 0:
        raise ValueError("need num_params > 0, trainers >= 1, engines >= 1, bytes_per_param > 0")
    copy = num_params * bytes_per_param
    gather = (trainers - 1) / trainers * copy
    if method == "reshard":
        return {"busiest_sender": copy / trainers, "total": copy}
    if method == "funnel":
        return {
            "busiest_sender": max(engines * copy, copy / trainers),
            "total": gather + engines * copy,
        }
    return {"busiest_sender": copy, "total": gather + engines * copy}


def rl_step_seconds(
    train_s: float, generate_s: float, sync_s: float, colocated: bool, off_policy_steps: int = 0
) -> float:
    """Seconds per RL step. Colocated: ``train + generate + sync`` (the sync is a copy in device
    memory, small but not zero). Disaggregated on-policy (``off_policy_steps = 0``): the engine
    waits for the new weights, ``train + sync + generate``. Disaggregated and ``k ≥ 1`` steps
    off-policy: generation of the next batch overlaps training, ``max(train, generate) + sync``."""
    if min(train_s, generate_s, sync_s) < 0 or off_policy_steps < 0:
        raise ValueError("times must be >= 0 seconds and off_policy_steps >= 0")
    if colocated or off_policy_steps == 0:
        return train_s + generate_s + sync_s
    return max(train_s, generate_s) + sync_s
