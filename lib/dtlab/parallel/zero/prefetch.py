"""FSDP prefetch depth and ``reshard_after_forward``, measured: exposed all-gather against memory.

Zhao et al., "PyTorch FSDP" (VLDB 2023, §3.3 backward and forward prefetching; §3.4 the rate
limiter that caps in-flight all-gathers). A unit's all-gather is *exposed* when its compute
starts before the gather landed. Launching it ``d`` units early (prefetch depth ``d``) lets it
*start* ``d`` units of compute early, and costs memory: up to ``d + 1`` units gathered at once
(``d`` in flight, one computing) instead of one. Starting early is not finishing early: the
gathers share one link (FSDP issues them on one stream) and run one after another, so when every
unit's gather outlasts its compute the link is already busy all the time at depth 1 and deeper
prefetch hides nothing more (exposed ≈ gather − compute per unit at any depth ≥ 1). Depth pays
where the link idles at depth 1 — uneven units, a big unit's gather after small ones whose
gathers finished under their compute — or where issuing the gather late is the problem (a
CPU-bound loop). :func:`prefetch_timeline` plays both cases. ``reshard_after_forward=False`` keeps every unit
gathered from its forward to its backward: the backward all-gather disappears (each step moves
2 instead of 3 transfers of the parameters, ZeRO-2's traffic) and the end of forward holds *all*
gathered parameters — the whole model unsharded, which is what ZeRO-3 existed to avoid. FSDP2
sets the same knobs with ``fully_shard(module, reshard_after_forward=...)`` and
``module.set_modules_to_forward_prefetch([...])`` / ``set_modules_to_backward_prefetch([...])``
(torch ≥ 2.6; an empty backward list falls back to FSDP2's implicit prefetch of one unit). So
FSDP2's depth-0 row is FSDP2 left at its defaults, not "no prefetch": it has no setting that
turns the implicit backward prefetch off.

:func:`measure_fsdp_prefetch` runs a stack of ``units`` MLP blocks (each an FSDP unit; the root
holds no parameters) under dtlab's FSDP for each (depth, reshard) setting, and FSDP2 with the
same settings beside it, interleaved step by step on the same ranks. Per setting:

* ``exposed_ms_per_unit`` — dtlab: the time a rank's main thread spent getting parameters (the
  ``wait:unit[k].all_gather`` idle span of a prefetched gather; all of a gather run on demand:
  torch's blocking span, or on ``collectives="dtlab"`` its ring steps and agreement check), per
  unit and step, median over steps of the mean over ranks
  (:func:`~dtlab.parallel.zero.prefetch_spans.exposed_gather_ns` says which span is which);
* ``all_gathers_per_step`` — counted from the spans (``2·units``, or ``units`` without reshard);
* ``overlapped`` — dtlab: whether part of a prefetched gather ran while the same rank computed
  (the intervals of its spans intersect, on every rank): ``False`` at depth 0, and on NCCL's
  counted path, which runs a prefetch inside its launch (its ring steps then count as exposed);
* ``peak_gathered_forward_bytes`` / ``peak_gathered_backward_bytes`` — dtlab: the largest sum of
  gathered buffers during forward / backward, counted from their storages
  (:attr:`~dtlab.parallel.zero.fsdp_lifecycle.FSDPLifecycle.peak_gathered_bytes`); equal to
  :func:`forward_peak_gathered_units` × one unit's gathered bytes in forward;
* ``peak_step_bytes`` — both implementations: the high-water mark of what one step allocates
  (CPU: the profiler's allocation events; GPU: the allocator), :func:`dtlab.memory.peak_bytes_of`.

FSDP2's exposed all-gather is not reported: its waits happen inside torch (no dtlab span), so
only its memory is set beside ours. Both collectives paths overlap: ``collectives="torch"`` on
gloo's own threads, ``collectives="dtlab"`` (every byte counted) on the ranks' background stream
(:mod:`dtlab.comm.background`, gloo only). The ranks share this machine's cores with the compute
they hide behind, so hiding is partial here.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from dtlab import trace
from dtlab.parallel.zero.prefetch_spans import (
    exposed_gather_ns,
    gathers_in,
    gathers_overlapped_compute,
)


def forward_peak_gathered_units(depth: int, units: int, reshard_after_forward: bool) -> int:
    """Units gathered at once at the forward's high point: ``min(depth + 1, units)`` with
    reshard (the computing one plus ``depth`` prefetched), ``units`` without (all kept)."""
    return units if not reshard_after_forward else min(depth + 1, units)


def all_gathers_per_step(units: int, reshard_after_forward: bool) -> int:
    """All-gathers one step launches: one per unit in forward, again in backward unless kept."""
    return units * (2 if reshard_after_forward else 1)


def forward_peak_gathered_bytes(
    depth: int, units: int, reshard_after_forward: bool, unit_bytes: int
) -> int:
    """:func:`forward_peak_gathered_units` × one unit's gathered bytes."""
    return forward_peak_gathered_units(depth, units, reshard_after_forward) * unit_bytes


def prefetch_timeline(gather_s: list[float], compute_s: list[float], depth: int) -> float:
    """Exposed all-gather seconds of one forward over units with these gather and compute
    times, at prefetch ``depth``, on one link that runs the gathers one after another.

    Unit 0's gather is issued at time 0; unit ``i``'s when unit ``max(0, i − depth)`` starts
    computing (depth 0: when unit ``i − 1`` finished); it runs once the link is free, and unit
    ``i`` computes once its gather landed and unit ``i − 1`` finished. Returns the forward's
    length minus its compute.
    """
    if len(gather_s) != len(compute_s) or depth < 0:
        raise ValueError("one gather and one compute time per unit, and depth >= 0")
    link_free = compute_end = 0.0
    starts: list[float] = []
    for i, (gather, compute) in enumerate(zip(gather_s, compute_s, strict=True)):
        issued = 0.0 if i == 0 else compute_end if depth == 0 else starts[max(0, i - depth)]
        link_free = max(link_free, issued) + gather
        starts.append(max(compute_end, link_free))
        compute_end = starts[-1] + compute
    return compute_end - sum(compute_s)


def step_bytes_per_rank(param_bytes: int, world: int, reshard_after_forward: bool) -> float:
    """Bytes one rank sends per step: each all-gather pass and the gradients' reduce-scatter
    move ``(N−1)/N`` of the parameters' bytes — three passes, or two when forward keeps the
    parameters for backward."""
    passes = all_gathers_per_step(1, reshard_after_forward) + 1
    return passes * (world - 1) / world * param_bytes


class _Block(nn.Module):
    """``x + W2·GELU(W1·x)``: one FSDP unit; its forward is drawn as a compute span."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc_in, self.fc_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with trace.span("block.forward", kind="compute"):
            return x + self.fc_out(torch.nn.functional.gelu(self.fc_in(x)))


def _stack(units: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[_Block(width) for _ in range(units)])


@dataclass
class PrefetchSetting:
    """One (depth, reshard_after_forward) setting for one implementation, measured."""

    implementation: str  # "dtlab" or "torch_fsdp2"
    depth: int
    reshard_after_forward: bool
    exposed_ms_per_unit: float | None  # None for FSDP2 (its waits are inside torch)
    all_gathers_per_step: int | None
    peak_gathered_forward_bytes: int | None
    peak_gathered_backward_bytes: int | None
    peak_step_bytes: int
    unit_gathered_bytes: int
    overlapped: bool | None = None  # an async gather ran under compute (None for FSDP2)


def _fsdp2(model: nn.Module, depth: int, reshard: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    blocks = list(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    if depth > 0 and hasattr(blocks[0], "set_modules_to_forward_prefetch"):
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + depth])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - depth) : i][::-1])
    return model


def _prefetch_rank(units, width, batch, depths, reshards, steps, collectives):
    from dtlab.memory import peak_bytes_of
    from dtlab.parallel.zero.fsdp import FullyShardedDataParallel

    torch.manual_seed(1)
    x = torch.randn(batch, width)
    settings = [(d, r) for d in depths for r in reshards]
    runs = {}
    for depth, reshard in settings:
        model = _stack(units, width)
        runs["dtlab", depth, reshard] = FullyShardedDataParallel(
            model, units=list(model), prefetch=depth > 0, collectives=collectives,
            forward_prefetch=depth, backward_prefetch=depth, reshard_after_forward=reshard,
        )  # fmt: skip
        runs["torch_fsdp2", depth, reshard] = _fsdp2(_stack(units, width), depth, reshard)
    peaks = {}

    def step(key, labels):
        model = runs[key]
        with trace.labels(**labels, phase="forward"):
            if key[0] == "dtlab":
                model.lifecycle.reset_peak()
            y = model(x)
            if key[0] == "dtlab":
                peaks[key, "forward"] = model.lifecycle.peak_gathered_bytes
                model.lifecycle.reset_peak()
        with trace.labels(**labels, phase="backward"):
            y.square().mean().backward()
            if key[0] == "dtlab":
                peaks[key, "backward"] = model.lifecycle.peak_gathered_bytes
        for p in model.parameters():
            p.grad = None

    for s in range(steps):
        for key in runs:
            step(key, {"step": s, "impl": key[0], "depth": key[1], "reshard": key[2]})
    step_peak = {key: peak_bytes_of(lambda k=key: step(k, {"step": -1})).peak_bytes for key in runs}
    first_block = runs[("dtlab", *settings[0])].units[1]  # unit 0 is the (empty) root
    unit_bytes = first_block.flat.element_size() * first_block.seg.padded_numel
    return {"peaks": peaks, "step_peak": step_peak, "unit_bytes": unit_bytes}


def _exposed(tr: trace.Trace, measured: list[int], units: int, **labels) -> float:
    values = []
    for step in measured:
        waited = exposed_gather_ns(tr.filter(step=step, impl="dtlab", **labels).spans)
        values.append(waited / 1e6 / max(len(tr.ranks), 1) / units)
    return statistics.median(values)


def measure_fsdp_prefetch(
    cluster,
    *,
    depths: tuple[int, ...] = (0, 1, 2),
    reshard_after_forward: tuple[bool, ...] = (True, False),
    units: int = 4,
    width: int = 256,
    batch: int = 64,
    steps: int = 4,
    warmup: int = 1,
    collectives: str = "torch",
) -> list[PrefetchSetting]:
    """Each setting of ``depths`` × ``reshard_after_forward``, for dtlab's FSDP and FSDP2, from
    one interleaved run (see the module docstring for what each field measures)."""
    if steps <= warmup:
        raise ValueError(f"steps={steps} leaves nothing after warmup={warmup}; raise steps")
    if collectives not in ("torch", "dtlab"):
        raise ValueError(f"collectives={collectives!r}: pass 'torch' or 'dtlab'")
    out = cluster.run(
        _prefetch_rank, units, width, batch, tuple(depths), tuple(reshard_after_forward),
        steps, collectives,
    )  # fmt: skip
    tr, measured = out.trace, list(range(warmup, steps))
    rows = []
    for depth in depths:
        for reshard in reshard_after_forward:
            for impl in ("dtlab", "torch_fsdp2"):
                key = (impl, depth, reshard)
                ours = impl == "dtlab"
                chosen = tr.filter(impl=impl, depth=depth, reshard=reshard)
                first = chosen.filter(step=measured[0]).spans
                hidden = gathers_overlapped_compute(
                    [s for s in chosen.spans if s.labels.get("step") in measured]
                )
                rows.append(
                    PrefetchSetting(
                        impl,
                        depth,
                        reshard,
                        _exposed(tr, measured, units, depth=depth, reshard=reshard)
                        if ours
                        else None,
                        gathers_in(first) // len(tr.ranks) if ours else None,
                        max(r["peaks"][key, "forward"] for r in out) if ours else None,
                        max(r["peaks"][key, "backward"] for r in out) if ours else None,
                        max(r["step_peak"][key] for r in out),
                        out[0]["unit_bytes"],
                        hidden if ours else None,
                    )  # fmt: skip
                )
    return rows


def fsdp_prefetch_figures(cluster, *, fast: bool = True, collectives: str = "torch") -> list[dict]:
    """The rows ``dtlab bench overlap`` prints for FSDP, from one interleaved run: every
    (implementation, depth, reshard_after_forward) of :func:`measure_fsdp_prefetch` as a dict
    with ``mechanism="fsdp_prefetch"``; FSDP2's rows carry its measured ``peak_step_bytes`` and
    ``None`` where dtlab cannot see inside torch."""
    size = dict(units=4, width=128, batch=32, steps=3) if fast else {}
    return [
        {"mechanism": "fsdp_prefetch", **asdict(row)}
        for row in measure_fsdp_prefetch(cluster, collectives=collectives, **size)
    ]
