"""A composed layout checked before any process starts: every reason it cannot run, at once.

torchtitan validates its parallel config up front; so does this. The checks, each with what to
choose instead:

* the degrees multiply to the world size (:meth:`dtlab.mesh.Layout.check`);
* the model splits this way (:func:`dtlab.mesh.layout_rules.model_layout_problems`): TP divides
  the heads, KV heads and MLP width (and the sequence, with SP); PP has a block per stage; CP
  divides the sequence (``2·cp`` chunks for zig-zag); EP divides the experts;
* TP stays inside a node (:func:`dtlab.mesh.layout_rules.node_problems`: its collectives sit
  between every layer's matmuls and need NVLink);
* what :func:`~dtlab.parallel.compose.compose_gpt` cannot compose (FSDP or SP with pipeline
  stages; EP with anything but DP): :func:`unsupported_combinations`, the one list both
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
    if layout.pp > 1 and data_parallel != "ddp":
        problems.append(
            f"data_parallel={data_parallel!r} with pp={layout.pp}: a pipeline stage runs once per "
            "micro-batch and dtlab's FSDP gathers its parameters per forward; use "
            "data_parallel='ddp' with pipeline stages, or pp=1"
        )
    if layout.ep > 1 and (layout.tp, layout.pp, layout.cp, data_parallel) != (1, 1, 1, "ddp"):
        problems.append(
            f"ep={layout.ep}: expert parallel composes here with data parallel (DDP) only; use "
            "tp=pp=cp=1 and data_parallel='ddp' with ep > 1"
        )
    if layout.pp > 1 and sequence_parallel:
        problems.append(
            "sequence_parallel=True with pipeline stages: the activations between stages would "
            "be sequence-sharded; use sequence_parallel=False with pp > 1"
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
