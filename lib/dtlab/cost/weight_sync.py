"""Moving weights between jobs: trainer → inference engine in RL post-training, and local SGD.

**RL weight sync.** In on-policy RL post-training (PPO, GRPO) a separate inference engine (vLLM,
SGLang) generates rollouts with the latest policy, so after every optimizer step (or every few)
the trainer's weights must reach it: ``P × bytes`` per sync, BF16 for 2 B/param, resharded from
the trainer's layout (FSDP/TP shards) to the engine's (its TP degree). Systems broadcast over a
NCCL group spanning trainer and engine ranks (OpenRLHF, veRL), or colocate both on the same
GPUs and hand over in device memory. :func:`weight_sync_seconds` prices the transfer at the
bandwidth of the path used.

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
