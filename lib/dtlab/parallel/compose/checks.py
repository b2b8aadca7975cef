"""A composed layout checked before any process starts: every reason it cannot run, at once.

torchtitan validates its parallel config up front; so does this. The checks, each with what to
choose instead:

* the degrees multiply to the world size (:meth:`dtlab.mesh.Layout.check`);
* the model splits this way (:func:`dtlab.models.validate_layout`): TP divides the heads, KV
  heads and MLP width; PP has a block per stage; CP divides the sequence (``2·cp`` chunks for
  zig-zag); EP divides the experts;
* TP stays inside a node (its collectives sit between every layer's matmuls and need NVLink);
* what :func:`~dtlab.parallel.compose.compose_gpt` cannot compose (FSDP or SP with pipeline
  stages; EP with anything but DP): :func:`unsupported_combinations`, the one list both
  :func:`composed_layout_problems` (before any process starts) and :func:`check_composition`
  (inside ``compose_gpt``, on the ranks) read.
"""

from __future__ import annotations

from dtlab.mesh import Layout
from dtlab.models import validate_layout

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
    try:
        style = "ring" if cp_style in ("allgather", "ring") else cp_style
        validate_layout(config, layout, cp_style=style, n_experts=n_experts)
    except ValueError as error:
        problems.append(str(error))
    if ranks_per_node is not None and layout.tp > ranks_per_node:
        fits = [t for t in range(1, ranks_per_node + 1) if ranks_per_node % t == 0]
        problems.append(
            f"tp={layout.tp} is larger than a node of {ranks_per_node} ranks: tensor parallel's "
            f"collectives run between every layer's matmuls and need the node's links; choose tp "
            f"from {fits} and put the rest into pp or dp"
        )
    problems.extend(unsupported_combinations(layout, data_parallel, sequence_parallel))
    return problems


def check_composed_layout(config, layout: Layout, world_size: int, **options) -> None:
    """Raise ``ValueError`` listing every problem :func:`composed_layout_problems` finds."""
    problems = composed_layout_problems(config, layout, world_size, **options)
    if problems:
        raise ValueError("this layout cannot run:\n- " + "\n- ".join(problems))
