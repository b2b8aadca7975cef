"""A composed layout checked before any process starts: every reason it cannot run, at once.

torchtitan validates its parallel config up front; so does this. The checks, each with what to
choose instead:

* the degrees multiply to the world size (:meth:`dtlab.mesh.Layout.check`);
* the model splits this way (:func:`dtlab.mesh.layout_rules.model_layout_problems`): TP divides
  the heads, KV heads and MLP width (and the sequence, with SP); PP has a block per stage; CP
  divides the sequence (``2·cp`` chunks for zig-zag); EP divides the experts;
* TP stays inside a node (:func:`dtlab.mesh.layout_rules.node_problems`: its collectives sit
  between every layer's matmuls and need NVLink);
* what :func:`~dtlab.parallel.compose.compose_gpt` cannot compose: EP with FSDP or HSDP (expert
  weights are reduced over ``edp``, which dtlab's FSDP does not shard) —
  :func:`unsupported_combinations`, the one list both :func:`composed_layout_problems` (before
  any process starts) and :func:`check_composition` (inside ``compose_gpt``, on the ranks) read.
  EP with DDP is composed with pipeline stages, with CP (balancing terms included; capacity,
  and with pipeline stages the global scope and the bias step, refused:
  :func:`per_token_router_problems`), and with TP on the folded mapping (EP groups of
  consecutive ranks over tp × cp × dp, each TP rank routing its own tokens; balancing terms
  too, but with ``tp > 1`` not capacity —
  :func:`~dtlab.parallel.compose.fold_experts.folded_problems`, checked on the ranks where the
  model's MoE configs are known).

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
    if layout.ep > 1 and data_parallel != "ddp":
        problems.append(
            f"ep={layout.ep} with data_parallel={data_parallel!r}: expert weights are reduced "
            "over edp, which dtlab's FSDP does not shard; use data_parallel='ddp' with ep > 1"
        )
    return problems


def capacity_problems(moe_configs, dim: str, degree: int, what_a_rank_holds: str) -> list[str]:
    """Capacity (token dropping) refused along ``dim`` when its ``degree`` > 1: which assignments
    one process drops depends on their place among all ``B·S`` tokens of the micro-batch, and a
    rank of ``dim`` holds only ``what_a_rank_holds``, so it would drop other assignments."""
    dropping = sorted({m.capacity_factor for m in moe_configs if m.capacity_factor is not None})
    if degree <= 1 or not dropping:
        return []
    return [
        f"capacity_factor={dropping[0]} with {dim}={degree}: one process drops assignments by "
        f"their place among all B·S tokens of the micro-batch, and each {what_a_rank_holds}, so "
        "it would drop other assignments; use MoEConfig(capacity_factor=None) (dropless) with "
        f"{dim} > 1, or {dim}=1"
    ]


def per_token_router_problems(layout: Layout, moe_configs) -> list[str]:
    """What the routers cannot count as one process does on this layout (on the carved-out
    mapping; the folded one has :func:`~dtlab.parallel.compose.fold_experts.folded_problems`).

    With CP a rank holds a share of every sequence. The balancing losses and the bias step are
    composed: their counts are summed over ``cp`` (and ``dp`` for the global scope and the bias)
    by :func:`dtlab.parallel.expert.balance.count_like_one_process`, the z-loss is a per-token
    mean. **Capacity is refused**: which assignments one process drops depends on their place
    among all ``B·S`` tokens, and a CP rank sees an interleaved subset (zig-zag chunks), so it
    would drop other assignments. The ``"global"`` scope is refused with pipeline stages: its
    running count is cleared before each forward of the whole model, which a pipeline step never
    calls. So is the bias step: it steps on the whole step's load, and a stage's router keeps
    only its latest micro-batch's counts (a stage without the MoE layer, none)."""
    problems = capacity_problems(
        moe_configs, "cp", layout.cp,
        "context-parallel rank holds an interleaved share of every sequence",
    )  # fmt: skip
    if layout.pp > 1 and any(m.aux_loss_scope == "global" for m in moe_configs):
        problems.append(
            f"aux_loss_scope='global' with pp={layout.pp}: the global count is cleared before "
            "each forward of the whole model, which pipeline stages never run; use "
            "aux_loss_scope='micro_batch' or 'sequence' with pp > 1, or pp=1"
        )
    if layout.pp > 1 and any(m.bias_balancing for m in moe_configs):
        problems.append(
            f"bias_balancing with pp={layout.pp}: the bias steps on the load of the whole step, "
            "and a pipeline stage's router keeps only its last micro-batch's counts (a stage "
            "without the MoE layer has none); use MoEConfig(bias_balancing=False) with pp > 1 "
            "(a balancing loss, aux_loss_weight > 0, is composed), or pp=1"
        )
    return problems


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
