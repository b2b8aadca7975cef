"""How a pipeline cuts the layers: uneven stages, trimmed ends, chunks per device, in-flight work.

**Cutting.** The ``L`` layers plus ``2·τ`` trimmed slots (``τ`` =
:attr:`~dtlab.plan.job.Requirements.pipeline_end_trim`: the first and last stage each give up
``τ`` layers to their embedding and output head, Llama 3 Sec. 3.3.2) are cut into ``c`` model
chunks as evenly as a whole number allows — ``⌊slots/c⌋`` each, the remainder going one apiece
to the chunks nearest the middle (the ends already carry the embedding and the head) — then the
first and last chunk lose their ``τ``. So 126 layers + 2 over 16 stages is 7, 8, …, 8, 7;
DeepSeek-V3's 61 over 16 is 3, 4, …, 4, 3 (13 stages of 4, 3 of 3). Any layer count works; a
chunk left with no slot is refused.

**Chunks per device.** ``1f1b`` and ``zb-h1``: ``c = pp·v``, chunk ``k`` on device ``k mod pp``
(interleaved 1F1B when ``v > 1``, Narayanan et al. 2021, Sec. 2.2). ``dualpipev``: ``c = 2·pp``
in a V — device ``i`` holds chunks ``i`` and ``2·pp−1−i``, so device 0 holds both ends
(Qi et al. 2024; DeepSeek's DualPipeV). ``dualpipe``: ``c = pp`` stages, device ``i`` runs
stage ``i`` for micro-batches flowing one way and stage ``pp−1−i`` for the other half, so it
*holds* both stages' parameters (DeepSeek-V3 Sec. 3.2.1: "two copies of the model parameters")
while each micro-batch still runs one stage's layers on it.

**In flight.** Activations a device holds at its peak, in (micro-batch × chunk) units, capped
at the ``m·v`` it runs in a step: 1F1B and ZB-H1 ``pp − i`` micro-batches on device ``i``;
interleaved, Megatron-LM's warm-up ``2·(pp−i−1) + (v−1)·pp`` plus the one in steady state
(which gives Korthikanti et al. 2022's ``L·(1 + (pp−1)/(pp·v))`` on device 0); DualPipe and
DualPipeV ``pp + 1`` micro-batches of a stage's layers (DeepSeek-V3, Table 2).
"""

from __future__ import annotations

from functools import lru_cache

from dtlab.plan.job import Requirements
from dtlab.plan.parallel_plan import ParallelPlan


def chunk_count(plan: ParallelPlan) -> int:
    """Model chunks the pipeline cuts: ``pp·v``, ``2·pp`` for DualPipeV, ``pp`` for DualPipe."""
    if plan.schedule == "dualpipev":
        return 2 * plan.pp
    if plan.schedule == "dualpipe":
        return plan.pp
    return plan.pp * plan.virtual_stages


def chunk_layers(req: Requirements, plan: ParallelPlan) -> list[int]:
    """Layers in each chunk, first to last (module docstring); negative where a trim overdraws."""
    return list(_chunk_layers(req, plan))


@lru_cache(maxsize=16384)
def _chunk_layers(req: Requirements, plan: ParallelPlan) -> tuple[int, ...]:
    chunks = chunk_count(plan)
    base, extra = divmod(req.pipeline_layer_slots, chunks)
    middle_first = sorted(range(chunks), key=lambda k: (abs(2 * k - (chunks - 1)), k))
    layers = [base] * chunks
    for k in middle_first[:extra]:
        layers[k] += 1
    layers[0] -= req.pipeline_end_trim
    layers[-1] -= req.pipeline_end_trim
    return tuple(layers)


def device_of_chunk(plan: ParallelPlan, k: int) -> int:
    """The pipeline device that runs chunk ``k``."""
    if plan.schedule == "dualpipev":
        return k if k < plan.pp else 2 * plan.pp - 1 - k
    return k % plan.pp


def stage_problems(req: Requirements, plan: ParallelPlan) -> list[str]:
    """Why the layers cannot be cut for this pipeline ([] when they can)."""
    problems = []
    chunks = chunk_count(plan)
    if plan.virtual_stages > 1 and (plan.pp == 1 or plan.schedule != "1f1b"):
        problems.append(
            "interleaving (virtual_stages > 1) needs a pipeline (pp >= 2) and the 1f1b schedule"
        )
    if plan.schedule in ("dualpipe", "dualpipev") and (plan.pp < 2 or plan.pp % 2):
        problems.append(f"{plan.schedule} needs an even number of stages >= 2, not pp {plan.pp}")
    if req.pipeline_layer_slots < chunks:
        problems.append(
            f"{chunks} model chunks for {req.n_layers} layers (+{2 * req.pipeline_end_trim} "
            "trimmed slots): a chunk would hold no layer; use fewer stages or less interleaving"
        )
    elif min(chunk_layers(req, plan)) < 0:
        problems.append(
            f"trimming {req.pipeline_end_trim} layer(s) from the first and last of {chunks} "
            "chunks leaves one with fewer than 0 layers; use fewer chunks"
        )
    return problems


def device_layers(req: Requirements, plan: ParallelPlan) -> list[int]:
    """Layers each device runs for one micro-batch (its chunks' layers together)."""
    return list(device_layer_counts(req, plan))


@lru_cache(maxsize=16384)
def device_layer_counts(req: Requirements, plan: ParallelPlan) -> tuple[int, ...]:
    """:func:`device_layers` as a cached tuple (the planner asks it for thousands of plans)."""
    if plan.pp == 1:
        return (req.n_layers,)
    per_device = [0] * plan.pp
    for k, n in enumerate(_chunk_layers(req, plan)):
        per_device[device_of_chunk(plan, k)] += n
    return tuple(per_device)


def held_layers(req: Requirements, plan: ParallelPlan) -> list[int]:
    """Layers whose parameters each device holds: :func:`device_layers`, and for DualPipe also
    the mirrored stage ``pp−1−i``'s."""
    run = device_layers(req, plan)
    if plan.schedule != "dualpipe":
        return run
    return [run[i] + run[plan.pp - 1 - i] for i in range(plan.pp)]


def holds_head(plan: ParallelPlan, device: int) -> bool:
    """Whether ``device`` runs the output head (the last chunk's device; DualPipe: both ends)."""
    last = device_of_chunk(plan, chunk_count(plan) - 1) if plan.pp > 1 else 0
    if plan.schedule == "dualpipe":
        return device in (0, plan.pp - 1)
    return device == last


def in_flight_chunks(plan: ParallelPlan, device: int, micro_batches: int) -> float:
    """(micro-batch × chunk) activations ``device`` holds at its peak (module docstring),
    in units of one micro-batch through all its layers when divided by its chunk count."""
    p, v, m = plan.pp, plan.virtual_stages, micro_batches
    if p == 1:
        return 1.0
    if plan.schedule in ("dualpipe", "dualpipev"):
        return float(min(m, p + 1))
    if v == 1:
        return float(min(m, p - device))
    warmup = 2 * (p - device - 1) + (v - 1) * p + 1
    return min(m * v, warmup) / v


def activation_layers_in_flight(
    req: Requirements, plan: ParallelPlan, micro_batches: int
) -> list[float]:
    """Per device, layers' worth of one micro-batch's activations held at the peak."""
    return [
        n * in_flight_chunks(plan, i, micro_batches) for i, n in enumerate(device_layers(req, plan))
    ]


@lru_cache(maxsize=16384)
def representative_devices(req: Requirements, plan: ParallelPlan) -> tuple[int, ...]:
    """The devices whose cost can differ: device 0, the head's device and DualPipe's mirror, and
    the first device of each layer count — later ones with as many layers hold no more in flight
    and compute the same, so the worst device is always among these."""
    layers = device_layer_counts(req, plan)
    chosen = {0, len(layers) - 1}
    chosen |= {k for k in range(len(layers)) if holds_head(plan, k)}
    seen: set[int] = set()
    for k, n in enumerate(layers):
        if n not in seen:
            seen.add(n)
            chosen.add(k)
    return tuple(sorted(chosen))
