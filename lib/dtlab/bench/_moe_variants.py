"""The rank side of ``dtlab bench moe``: every variant's step, built on one rank and timed there.

:func:`measure_on_rank` runs on each rank (shipped by :func:`dtlab.bench.run_on_ranks`): it
routes this rank's tokens, builds the variants :mod:`dtlab.bench.moe` describes (the exchange
over ``all_to_all_single`` and over dtlab's counted messages, the bare torch calls, the generic
all-to-all, the dispatch alone and deduplicated, the experts grouped and looped), times them
rotated (:func:`dtlab.bench.run_interleaved`), then times each pair of :data:`PAIRS` in a run of
its own, and returns the seconds, the bytes dtlab counted and the routed counts that
:func:`dtlab.bench.moe.run` turns into ratios. The leading underscore keeps this module off
``dtlab bench``'s list: it is a part of the ``moe`` benchmark, not one of its own.
"""

from __future__ import annotations

WARMUP_ROUNDS = 1
# The two exchange ratios, each timed again in a run of its own two variants: rotating two
# variants alternates which goes first, so each follows the other as often as itself. In the
# run of every variant each always follows the same neighbour, and the neighbour shows: moving
# a2a_torch from after a2a_dtlab to right after the experts' compute moved its ratio to
# a2a_torch_plain from 1.18× to 1.44× (EP 4 on the 2-core host, the same code).
PAIRS = {"checked": ("a2a_torch", "a2a_torch_plain"), "counted": ("a2a_dtlab", "a2a_torch")}


def measure_on_rank(
    tokens: int, dim: int, experts: int, top_k: int, steps: int, repeats: int, ranks_per_node: int
) -> dict:
    import torch
    import torch.distributed as dist

    import dtlab
    from dtlab import trace
    from dtlab.bench import run_interleaved
    from dtlab.comm import Communicator, all_to_all_rows
    from dtlab.models.moe_experts import Experts, grouped_mm_refusal
    from dtlab.models.moe_router import route
    from dtlab.parallel.expert import TokenExchange, dispatch_splits
    from dtlab.parallel.expert.dedup import dedup_dispatch

    device = dtlab.device()
    ep, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(tokens, dim, generator=g).to(device)
    router = torch.randn(experts, dim, generator=torch.Generator().manual_seed(0)).to(device)
    routing = route(x, router, top_k)
    expert = routing.expert_index.reshape(-1)
    order = torch.argsort(expert, stable=True)
    rows = x.repeat_interleave(top_k, 0)[order].contiguous()
    counts = torch.bincount(expert, minlength=experts)
    communicators = {v: Communicator(None, collectives=v, dim="ep") for v in ("dtlab", "torch")}
    exchanges = {v: TokenExchange(c) for v, c in communicators.items()}
    alone = {v: TokenExchange(Communicator(None, collectives=v, dim="ep")) for v in communicators}
    generic = Communicator(None, collectives="dtlab", dim="ep")

    def exchange(tokens: TokenExchange) -> None:
        splits = tokens.exchange_counts(counts, dim, rows.dtype)
        arrived = tokens.exchange_rows(rows, splits.send, splits.recv, "dispatch")
        tokens.exchange_rows(arrived, splits.recv, splits.send, "combine")

    def dispatch_only(tokens: TokenExchange) -> None:
        splits = tokens.exchange_counts(counts, dim, rows.dtype)
        tokens.exchange_rows(rows, splits.send, splits.recv, "dispatch")

    dedup_comm = Communicator(None, collectives="dtlab", dim="ep")
    dedup_bytes: list[dict] = []

    def dedup() -> None:
        result = dedup_dispatch(x, routing.expert_index, dedup_comm, experts, ranks_per_node)
        dedup_bytes.append(result.bytes_sent)

    def plain(comm: Communicator) -> None:
        send, recv, _ = dispatch_splits(counts, comm)
        arrived = all_to_all_rows(rows, comm, recv, send)
        all_to_all_rows(arrived, comm, send, recv)

    send, recv, received = dispatch_splits(counts, communicators["torch"])
    local_rows = all_to_all_rows(rows, communicators["torch"], recv, send)
    local = torch.arange(experts // ep, device=device).repeat(ep)
    local_order = torch.argsort(local.repeat_interleave(received.reshape(-1)), stable=True)
    local_rows = local_rows[local_order].contiguous()
    local_counts = received.sum(0).tolist()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CUDA's grouped GEMM: bf16
    local_rows = local_rows.to(dtype)
    torch.manual_seed(0)
    layer = Experts(experts // ep, dim, 4 * dim, device=device).to(dtype)

    def compute(backend: str) -> None:
        layer.backend = backend
        inputs = local_rows.detach().requires_grad_()
        layer(inputs, local_counts).square().mean().backward()

    def labelled(name, fn):
        def step(i: int) -> None:
            with trace.labels(variant=name, round=i):
                fn()

        step.__wrapped__ = fn
        return step

    variants = {
        # the goal's pair first and side by side: neither always follows the posted messages
        "a2a_torch": labelled("a2a_torch", lambda: exchange(exchanges["torch"])),
        "a2a_torch_plain": labelled("a2a_torch_plain", lambda: plain(communicators["torch"])),
        "a2a_dtlab": labelled("a2a_dtlab", lambda: exchange(exchanges["dtlab"])),
        "a2a_generic": labelled("a2a_generic", lambda: plain(generic)),
        "dispatch_plain": labelled("dispatch_plain", lambda: dispatch_only(alone["dtlab"])),
        "dispatch_torch": labelled("dispatch_torch", lambda: dispatch_only(alone["torch"])),
        "dispatch_dedup": labelled("dispatch_dedup", dedup),
        "experts_loop": labelled("experts_loop", lambda: compute("loop")),
    }
    refusal = grouped_mm_refusal(local_rows, layer.fc_in.weight, layer.fc_out.weight)
    if refusal is None:
        variants["experts_grouped"] = labelled("experts_grouped", lambda: compute("grouped"))
    communicators["dtlab"].comm_stats.reset()
    seconds = run_interleaved(variants, steps * repeats, WARMUP_ROUNDS)
    calls = WARMUP_ROUNDS + steps * repeats
    counted_bytes = communicators["dtlab"].comm_stats.bytes_sent // calls
    paired = {
        pair: run_interleaved(
            {k: labelled(f"{k} ({pair})", variants[k].__wrapped__) for k in PAIRS[pair]},
            steps * repeats,
            WARMUP_ROUNDS,
        )
        for pair in PAIRS
    }
    return {
        "seconds": seconds,
        "paired": paired,
        "dtlab_bytes_per_exchange": counted_bytes,
        "tokens_per_expert": counts.tolist(),
        "routed": routing.expert_index.tolist(),
        "dedup_bytes": dedup_bytes[-1],
        "grouped_refusal": refusal,
    }
