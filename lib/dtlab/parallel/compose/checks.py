"""A composed layout checked before any process starts: every reason it cannot run, at once.

torchtitan validates its parallel config up front; so does this. The checks, each with what to
choose instead:

* the degrees multiply to the world size (:meth:`dtlab.mesh.Layout.check`);
* the model splits this way (:func:`dtlab.mesh.layout_rules.model_layout_problems`): TP divides
  the heads, KV heads and MLP width (and the sequence, with SP); PP has a block per stage; CP
  divides the sequence (``2·cp`` chunks for zig-zag); EP divides the experts;
* TP stays inside a node (:func:`dtlab.mesh.layout_rules.node_problems`: its collectives sit
  between every layer's matmuls and need NVLink);
* what :func:`~dtlab.parallel.compose.compose_gpt` cannot compose (EP with TP or FSDP; EP with
  CP only for a per-token router, :func:`per_token_router_problems`; EP with DDP and pipeline
  stages is composed): :func:`unsupported_combinations`, the one list both
  :func:`composed_layout_problems` (before any process starts) and :func:`check_composition`
  (inside ``compose_gpt``, on the ranks) read.

The first three are :mod:`dtlab.mesh.layout_rules`' rules (their one home); only the last is this
file's own.
"""

from __future__ import annotations

from dtlab.mesh import Layout
from dtlab.mesh.layout_rules import model_layout_problems, node_problems

DATA_PARALLEL = ("ddp", "fsdp", "hsdp")


def unsupported_combinations(
    layout: Layout, data_parallel: str, sequence_parallel: bool
) -> list[str]:
    """What :func:`~dtlab.parallel.compose.compose_gpt` does not compose, with what to choose."""
    problems = []
    if data_parallel not in DATA_PARALLEL:
        problems.append(f"data_parallel={data_parallel!r}; choose one of {DATA_PARALLEL}")
    if layout.ep > 1 and layout.tp > 1:
        problems.append(
            f"ep={layout.ep} with tp={layout.tp}: compose_gpt carves EP out of dp only, and its "
            "tensor parallel does not split MoE layers; use tp=1 with ep > 1 (the folded "
            "mapping that carves EP out of tp × dp is dtlab.parallel.compose.folding's "
            "FoldedMapping — its groups, not yet its training step)"
        )
    if layout.ep > 1 and data_parallel != "ddp":
        problems.append(
            f"ep={layout.ep} with data_parallel={data_parallel!r}: expert weights are reduced "
            "over edp, which dtlab's FSDP does not shard; use data_parallel='ddp' with ep > 1"
        )
    return problems


def per_token_router_problems(layout: Layout, moe_configs) -> list[str]:
    """EP with CP: a context-parallel rank holds a share of each sequence, so whatever a router
    computes over *all* its tokens — the balancing losses, the capacity, the bias step's counts
    — would be taken over a different set of tokens than one process takes. Composed only for a
    router whose every output depends on its own token (dropless, no balancing loss or bias);
    Megatron instead all-reduces the counts over its tp × cp group."""
    if layout.ep == 1 or layout.cp == 1:
        return []
    per_token = all(
        (m.aux_loss_weight, m.z_loss_weight, m.capacity_factor, m.bias_balancing)
        == (0, 0, None, False)
        for m in moe_configs
    )
    if per_token:
        return []
    return [
        f"ep={layout.ep} with cp={layout.cp}: each context-parallel rank routes a share of every "
        "sequence, so balancing losses, capacity and bias counts would be taken over other tokens "
        "than one process takes; use MoEConfig(aux_loss_weight=0, z_loss_weight=0, "
        "capacity_factor=None, bias_balancing=False) with cp > 1, or cp=1"
    ]


def check_composition(mesh, data_parallel: str, sequence_parallel: bool, schedule) -> None:
    """Refuse, on the ranks, what :func:`~dtlab.parallel.compose.compose_gpt` cannot compose."""
    layout = mesh.layout
    problems = unsupported_combinations(layout, data_parallel, sequence_parallel)
    if layout.pp > 1 and schedule is None:
        problems.insert(0, f"pp={layout.pp} needs a schedule, e.g. one_f_one_b({layout.pp}, 4)")
    if problems:
        raise ValueError("; ".join(problems))


def composed_layout_problems(
    config,
    layout: Layout,
    world_size: int,
    *,
    ranks_per_node: int | None = None,
    cp_style: str = "zigzag",
    n_experts: int | None = None,
    data_parallel: str = "ddp",
    sequence_parallel: bool = False,
) -> list[str]:
    """Every reason ``layout`` cannot train ``config`` on ``world_size`` ranks ([] when none)."""
    problems = []
    try:
        layout.check(world_size)
    except ValueError as error:
        problems.append(str(error))
    problems += model_layout_problems(
        config,
        layout,
        cp_style=cp_style,
        n_experts=n_experts,
        sequence_parallel=sequence_parallel,
    )
    if ranks_per_node is not None:
        problems += node_problems(layout.tp, ranks_per_node)
    problems.extend(unsupported_combinations(layout, data_parallel, sequence_parallel))
    return problems


def check_composed_layout(config, layout: Layout, world_size: int, **options) -> None:
    """Raise ``ValueError`` listing every problem :func:`composed_layout_problems` finds."""
    problems = composed_layout_problems(config, layout, world_size, **options)
    if problems:
        raise ValueError("this layout cannot run:\n- " + "\n- ".join(problems))
