"""Our executor and ``torch.distributed.pipelining`` give the same loss and gradients.

Every schedule class named in issue 14 exists in this torch and runs on gloo: ``ScheduleGPipe``,
``Schedule1F1B`` (one ``PipelineStage`` per rank), ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble`` (its ZB1P with one stage per rank is our ZB-H1) and
``ScheduleDualPipeV`` (two stages per rank in a V). Same model cut into the same stages, same
micro-batches (torch splits the batch along dim 0, as we do), fp64: the mean loss and every
gradient agree to :data:`TOLERANCE`. torch does not sum tied-embedding gradients across ranks;
we apply the same :func:`sum_tied_gradients` after its step, as a Megatron-style trainer would.

DualPipeV runs untied: with both ends of the V on rank 0, the tied matrix is one Parameter of
two torch ``PipelineStage`` objects, and torch divides its gradient by ``m`` once per stage.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn

TOLERANCE = 1e-12
TORCH_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "zb_h1": "ScheduleInterleavedZeroBubble",
    "dualpipe_v": "ScheduleDualPipeV",
}


def _config(p: int, tied: bool) -> GPTConfig:
    return GPTConfig.tiny(
        vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2 * p, tie_embeddings=tied
    )


def _ours_and_torchs_on_rank(p: int, cases: list[tuple[str, int]]) -> list[dict]:
    import torch.distributed.pipelining as pipelining

    from dtlab.mesh import Mesh
    from dtlab.models import split_into_stages
    from dtlab.parallel.pipeline import (
        SCHEDULES,
        embedding_group,
        pipeline_gpt,
        sum_tied_gradients,
    )

    mesh = Mesh(pp=p)
    results = []
    for name, m in cases:
        schedule, config = SCHEDULES[name](p, m), _config(p, tied=name != "dualpipe_v")
        inputs, targets = SyntheticTokens(config, n_batches=1, batch_size=2 * m, seed=3)[0]

        ours = pipeline_gpt(GPT(config, seed=0, dtype=torch.float64), mesh, schedule)
        our_loss = ours.step(inputs, targets)

        stages = split_into_stages(GPT(config, seed=0, dtype=torch.float64), schedule.n_stages)
        mine = {s: stages[s] for s in schedule.stages_of(mesh.pp_rank)}
        torch_stages = [
            pipelining.PipelineStage(
                module, s, schedule.n_stages, torch.device("cpu"), group=mesh.pp_group
            )
            for s, module in mine.items()
        ]
        single = name in ("gpipe", "1f1b")
        theirs = getattr(pipelining, TORCH_CLASSES[name])(
            torch_stages[0] if single else torch_stages, n_microbatches=m, loss_fn=loss_fn
        )
        losses: list[torch.Tensor] = []
        args = (inputs,) if 0 in mine else ()
        kwargs = {"target": targets, "losses": losses} if schedule.n_stages - 1 in mine else {}
        theirs.step(*args, **kwargs)
        sum_tied_gradients(mine, embedding_group(mesh, schedule))

        our_grads = {n: q.grad for st in ours.stages.values() for n, q in st.named_parameters()}
        their_grads = {n: q.grad for st in mine.values() for n, q in st.named_parameters()}
        results.append(
            {
                "names": sorted(our_grads) == sorted(their_grads),
                "loss": None if our_loss is None else abs(our_loss - torch.stack(losses).mean()),
                "grads": max((our_grads[n] - their_grads[n]).abs().max() for n in our_grads),
            }
        )
    return results


@pytest.mark.parametrize("p", [2, 4])
def test_every_schedule_matches_torch_distributed_pipelining(p, request):
    cluster = request.getfixturevalue(f"cluster{p}")
    cases = [(name, 2 * p) for name in TORCH_CLASSES] + [("1f1b", p + 1)]
    per_rank = cluster.run(_ours_and_torchs_on_rank, p, cases)
    for i, case in enumerate(cases):
        assert all(r[i]["names"] for r in per_rank), case
        losses = [r[i]["loss"] for r in per_rank if r[i]["loss"] is not None]
        assert len(losses) == 1 and losses[0] < TOLERANCE, (case, losses)
        assert max(r[i]["grads"] for r in per_rank) < TOLERANCE, case
