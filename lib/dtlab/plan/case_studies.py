"""The numbers behind the case studies (lab 11's published runs, lab 14's case studies, the bank).

Each function answers one question about a published run of :mod:`dtlab.plan.published`, by
the planner's model, so a bank key that cites it moves when the model does:

* Llama 3 405B — :func:`llama3_dp_outermost_seconds` (why DP can sit on the slowest links),
  :func:`llama3_allgather_cp_exposed_s` (the all-gather CP it accepted, exposed),
  :func:`llama3_stage_peaks_gb` (why trimming the first and last stage moves the peak),
  :func:`llama3_fsdp_reshard_bytes_ratio` (why its FSDP does not reshard after forward);
* DeepSeek-V3 — :func:`deepseek_bubble_ratio` (DualPipe's idle time against 1F1B's),
  :func:`deepseek_remote_copies` (node-limited routing), :func:`deepseek_tp_seconds` (the TP it
  avoided);
* Megatron-LM 2021 — :func:`megatron_zero3_implied_bandwidth` (what its ZeRO-3 runs' steps imply).
"""

from __future__ import annotations

from dataclasses import replace

from dtlab.cost.bubble import schedule_idle
from dtlab.plan.compute import micro_batch_compute
from dtlab.plan.exposed import remote_copies_per_token
from dtlab.plan.layout_cost import activation_bytes_by_device, micro_batches
from dtlab.plan.memory_by_category import memory_by_device
from dtlab.plan.published import PUBLISHED_RUNS, PublishedRun, implied_zero3_bandwidth
from dtlab.plan.step_time import step_time


def published_run(name: str) -> PublishedRun:
    """The published run called ``name`` (one of :data:`~dtlab.plan.published.PUBLISHED_RUNS`)."""
    for run in PUBLISHED_RUNS:
        if run.name == name:
            return run
    raise KeyError(f"no published run {name!r}; choose one of {[r.name for r in PUBLISHED_RUNS]}")


def predicted(name: str, part: str = "step_s") -> float:
    """One field of the model's :class:`~dtlab.plan.step_time.StepTime` for a published run."""
    run = published_run(name)
    return float(getattr(step_time(run.job, run.plan), part))


def published(name: str, part: str = "step_s") -> float:
    """One published figure of a run (``step_s``, ``mfu_6n``, ``mfu_attention``)."""
    return float(getattr(published_run(name), part))


def llama3_dp_outermost_seconds(gpus: int = 16384) -> float:
    """Seconds per step Llama 3's DP sync takes in all (FP32 reduce-scatter and bf16 all-gather
    of each GPU's 3.2B-parameter shard over its one 50 GB/s NIC): once per step, against a
    step of several seconds — why DP tolerates the slowest links, while PP's sends wait on the
    critical path of every micro-batch."""
    return predicted(f"Llama 3 405B, 8K, {gpus:,} H100", "dp_s")


def llama3_allgather_cp_exposed_s() -> float:
    """Seconds per step Llama 3's all-gather CP exposes at 131K context (CP 16 across 16 nodes):
    K and V gathered before attention, their gradients reduce-scattered after, nothing hidden."""
    return predicted("Llama 3 405B, 128K, 16,384 H100", "cp_exposed_s")


def llama3_stage_peaks_gb(device: int) -> float:
    """Activation GB on pipeline device ``device`` of Llama 3's 16,384-GPU layout as 1F1B
    (interleaving off) would hold them: device 0 runs 7 layers (one trimmed) with 16
    micro-batches in flight, device 1 runs 8 with 15."""
    run = published_run("Llama 3 405B, 8K, 16,384 H100")
    plan = replace(run.plan, virtual_stages=1)
    return activation_bytes_by_device(run.job, plan)[device] / 1e9


def llama3_worst_stage_gb() -> float:
    """GB per GPU on the worst pipeline device of Llama 3's published 8K, 16,384-GPU layout."""
    run = published_run("Llama 3 405B, 8K, 16,384 H100")
    return max(m.total for m in memory_by_device(run.job, run.plan)) / 1e9


def llama3_fsdp_reshard_bytes_ratio() -> float:
    """DP seconds of Llama 3's layout with FSDP resharding after every forward, over without:
    16 micro-batches each gathering twice and reducing once, against one gather and one
    reduction per step."""
    run = published_run("Llama 3 405B, 8K, 16,384 H100")
    resharded = step_time(run.job, replace(run.plan, reshard_after_forward=True)).dp_s
    return resharded / step_time(run.job, run.plan).dp_s


def deepseek_bubble_ratio() -> float:
    """DeepSeek-V3's DualPipe idle time over 1F1B's, from its stage's own ``F``, ``B``, ``W``:
    ``(p/2−1)(F+2B−W)`` against ``(p−1)(F+B+W)``."""
    run = published_run("DeepSeek-V3, 2,048 H800")
    c = micro_batch_compute(run.job, run.plan, 1)
    p = run.plan.pp
    dual = schedule_idle("dualpipe", p, 1, c.forward_s, c.input_grad_s, c.weight_grad_s)
    flat = schedule_idle("1f1b", p, 1, c.forward_s, c.input_grad_s, c.weight_grad_s)
    return dual / flat


def deepseek_remote_copies(node_limit: int | None = 4, dedup: bool = True) -> float:
    """Network copies per token of DeepSeek-V3's dispatch (top 8 of 256 experts over 8 nodes):
    3.5 with one copy per node and at most 4 nodes, 4.6 without the limit, 7 per expert."""
    if not dedup:
        return 8 * 7 / 8
    return remote_copies_per_token(8, 256, 8, node_limit)


def deepseek_tp_seconds(tp: int = 2) -> float:
    """Exposed TP seconds per step DeepSeek-V3's layout would add with ``tp`` (EP 64 and PP 16
    kept, DP shrunk): the per-layer collectives it avoided by running without TP."""
    run = published_run("DeepSeek-V3, 2,048 H800")
    plan = replace(run.plan, tp=tp, dp=run.plan.dp // tp, ep=run.plan.ep // tp)
    return step_time(run.job, plan).tp_exposed_s


def deepseek_micro_batches() -> int:
    """Micro-batches per pipeline per step in DeepSeek-V3's layout (micro-batch 1, assumed)."""
    run = published_run("DeepSeek-V3, 2,048 H800")
    return int(micro_batches(run.job, run.plan))


def megatron_zero3_implied_bandwidth(gpus: int = 1536) -> float:
    """GB/s per GPU Megatron-LM 2021's ZeRO-3 175B row on ``gpus`` A100s implies for its
    data-parallel traffic (:func:`~dtlab.plan.published.implied_zero3_bandwidth`)."""
    return implied_zero3_bandwidth(published_run(f"GPT-3 175B, {gpus:,} A100 ZeRO-3")) / 1e9


def megatron_175b_stage0_activations_gb(
    recompute: str = "none", sequence_parallel: bool = False, software: str = "megatron-lm-2021"
) -> float:
    """GB of activations on pipeline device 0 of Megatron-LM 2021's 384-GPU GPT-3 175B layout
    (TP 8, PP 12, micro-batch 1) run as plain 1F1B with ``recompute``, with or without sequence
    parallelism, on ``software`` (2021's holds every in-flight stage output too): why the 2021
    recipe recomputed every layer, and what Korthikanti et al. 2022 changed."""
    run = published_run("GPT-3 175B, 384 A100 PTD-P")
    plan = replace(
        run.plan, recompute=recompute, sequence_parallel=sequence_parallel, virtual_stages=1
    )
    return activation_bytes_by_device(replace(run.job, software=software), plan)[0] / 1e9
