"""Every schedule, run on real ranks, gives the single-process GPT's loss and gradients.

The lab GPT (tied embedding and head) is cut into ``p`` stages (``2p`` for interleaved v=2 and
DualPipeV) and trained one step on ``m`` micro-batches by each schedule; the loss and every
parameter's gradient (tied ones after the embedding-group all-reduce) equal the full model's
on the whole batch, in fp64, to :data:`TOLERANCE` — only the order of the micro-batch sums
differs. ``m`` covers ``p``, ``2p`` and an odd count; DualPipeV needs ``m >= 2p`` and
interleaved 1F1B ``m`` a multiple of ``max(1, m // p)``, so they take their nearest valid ones.
"""

from __future__ import annotations

import pytest
import torch

from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn

TOLERANCE = 1e-12
MICRO_BATCH = 2


def _config(p: int) -> GPTConfig:
    return GPTConfig.tiny(vocab_size=32, seq_len=8, d_model=16, n_heads=2, n_layers=2 * p)


def _cases(p: int) -> list[tuple[str, int]]:
    odd = 2 * p + 1
    return [
        *[(name, m) for name in ("gpipe", "1f1b", "zb_h1") for m in (p, 2 * p, odd)],
        *[("interleaved_1f1b", m) for m in (p, 2 * p, p + 1)],
        *[("dualpipe_v", m) for m in (2 * p, odd)],
    ]


def _batch(p: int, m: int):
    return SyntheticTokens(_config(p), n_batches=1, batch_size=MICRO_BATCH * m, seed=3)[0]


def _every_schedule_on_rank(p: int, cases: list[tuple[str, int]]) -> list[dict]:
    from dtlab.mesh import Mesh
    from dtlab.parallel.pipeline import SCHEDULES, pipeline_gpt

    mesh = Mesh(pp=p)
    results = []
    for name, m in cases:
        pipe = pipeline_gpt(
            GPT(_config(p), seed=0, dtype=torch.float64), mesh, SCHEDULES[name](p, m)
        )
        loss = pipe.step(*_batch(p, m))
        grads = {
            n: param.grad.clone()
            for stage in pipe.stages.values()
            for n, param in stage.named_parameters()
        }
        results.append({"loss": None if loss is None else loss.item(), "grads": grads})
    return results


def _reference(p: int, m: int) -> tuple[float, dict[str, torch.Tensor]]:
    model = GPT(_config(p), seed=0, dtype=torch.float64)
    inputs, targets = _batch(p, m)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    grads = {n: param.grad for n, param in model.named_parameters()}
    grads["lm_head.weight"] = model.lm_head.weight.grad  # tied: the same tensor
    return loss.item(), grads


@pytest.mark.parametrize("p", [2, 4])
def test_every_schedule_matches_the_single_process_gpt(p, request):
    cluster = request.getfixturevalue(f"cluster{p}")
    cases = _cases(p)
    per_rank = cluster.run(_every_schedule_on_rank, p, cases)
    for i, (name, m) in enumerate(cases):
        ref_loss, ref_grads = _reference(p, m)
        losses = [r[i]["loss"] for r in per_rank if r[i]["loss"] is not None]
        assert len(losses) == 1, (name, m)  # only the rank holding the last stage reports it
        assert abs(losses[0] - ref_loss) < TOLERANCE, (name, m)
        seen = set()
        for r in per_rank:
            for n, grad in r[i]["grads"].items():
                assert (grad - ref_grads[n]).abs().max().item() < TOLERANCE, (name, m, n)
                seen.add(n)
        assert seen == set(ref_grads), (name, m)  # every parameter lives on some stage
