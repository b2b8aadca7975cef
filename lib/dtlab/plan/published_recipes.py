"""Layouts a team published as its recommendation, without a step time: rank only.

A recipe says which layout its authors found fastest for a job on their hardware; it reports
no step, so it cannot check the model's seconds, only its **order**: the planner should rank the
recipe among its fastest plans for the same job.

* **NVIDIA NeMo's GPT-3 175B** (NeMo-Framework-Launcher, ``launcher_scripts/conf/training/
  gpt3/175b.yaml`` and ``examples/training/gpt/a100/175b_16node.sh``): the 2021 paper's model
  (:data:`~dtlab.plan.megatron_jobs.GPT3_175B`) in BF16 — 128 nodes with a batch of 2,048
  sequences (the yaml names no GPU; priced here on Selene's DGX A100s like the 2021 rows), and
  16 DGX A100 nodes with 256 (the script under ``a100/``) — at TP 4, PP 8, interleaving depth 12,
  micro-batch 1, sequence parallelism, selective recomputation, pipeline exchanges overlapped,
  and apex's ``distributed_fused_adam`` (optimizer state sharded over DP, a whole gradient
  buffer kept: ZeRO-1). The software is today's (``"current"``). The recipe also overlaps TP's
  forward collectives (``ub_tp_comm_overlap``); the planner's search never tries
  ``async_tp``, so the recipe is priced without it, on equal terms with the plans it ranks
  among (with it, it would beat them all).

They bear on the 2021 layouts the planner does not rank in its fastest quarter
(:mod:`dtlab.plan.published`): of the plans it puts ahead of Narayanan et al.'s TP 8 × PP 12,
the fastest that recomputes as that layout did is TP 4 at 384, 768 and 1,536 GPUs — under half
the TP bytes per GPU, wider GEMMs — and the layout NVIDIA later recommended for the same model
is TP 4 too. (The others ahead are micro-batch 2, other depths and interleavings, and plans
that keep every activation: two at 384 GPUs, four at 768 and 1,536.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dtlab.plan.job import Requirements
from dtlab.plan.megatron_jobs import GPT3_175B
from dtlab.plan.parallel_plan import ParallelPlan
from dtlab.plan.published_run import passing_plans_timed, share_faster
from dtlab.plan.step_time import step_time

NEMO_SOURCE = (
    "NVIDIA NeMo-Framework-Launcher, launcher_scripts/conf/training/gpt3/175b.yaml and "
    "examples/training/gpt/a100/175b_16node.sh"
)


@dataclass(frozen=True)
class PublishedRecipe:
    """A job and the layout its authors recommend for it (no published step time)."""

    name: str
    source: str
    job: Requirements
    plan: ParallelPlan


def _nemo_gpt3_175b(nodes: int, batch: int) -> PublishedRecipe:
    gpus = 8 * nodes
    job = replace(
        GPT3_175B,
        name=f"GPT-3 175B, {gpus:,} A100 (NeMo recipe)",
        n_gpus=gpus,
        global_batch_tokens=batch * 2048,
        software="current",
    )
    # dp, TP 4, PP 8, ZeRO-1, micro-batch 1, 12 chunks per device
    plan = ParallelPlan(gpus // 32, 4, 8, 1, 1, 12, recompute="selective", sequence_parallel=True)
    return PublishedRecipe(job.name, NEMO_SOURCE, job, plan)


PUBLISHED_RECIPES: tuple[PublishedRecipe, ...] = (
    _nemo_gpt3_175b(nodes=16, batch=256),
    _nemo_gpt3_175b(nodes=128, batch=2048),
)


def recipe_rank_fraction(recipe: PublishedRecipe) -> float:
    """The share of the planner's passing plans for the recipe's job faster than the recipe."""
    steps = [t.step_s for t, _ in passing_plans_timed(recipe.job)]
    return share_faster(steps, step_time(recipe.job, recipe.plan).step_s)
