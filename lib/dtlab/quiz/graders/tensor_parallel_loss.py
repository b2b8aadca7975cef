"""Grader for lab 04's vocabulary-parallel cross-entropy (see :mod:`.tensor_parallel` for the
exercise contract and what the watcher refuses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.tensor_parallel import (
    GRAD_TOLERANCE,
    LOGIT_OFFSETS,
    LOSS_TOLERANCE,
    NEVER_THE_LOGITS,
    TOKENS,
    VOCABS,
    _calls,
    _gap,
    _library_answers,
    _refuse_library,
    _sent,
)
from dtlab.quiz.graders.watch import noticing_calls, watching


# -- the vocabulary-parallel cross-entropy -------------------------------------------------------
def _cross_entropy_on_rank(fn: Callable, vocab: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import dtlab
    from dtlab.mesh import Mesh

    rank, t, device = dist.get_rank(), dist.get_world_size(), dtlab.device()
    group = Mesh(tp=t).tp_group
    g = torch.Generator().manual_seed(vocab)
    offsets = torch.tensor(LOGIT_OFFSETS).repeat(TOKENS // len(LOGIT_OFFSETS))
    logits = 3 * torch.randn(TOKENS, vocab, generator=g) + offsets[:, None]
    targets = torch.randint(vocab, (TOKENS,), generator=g)
    full = logits.double().requires_grad_()
    F.cross_entropy(full, targets).backward()
    want_loss = F.cross_entropy(full.detach(), targets).item()

    shard = logits.chunk(t, -1)[rank].contiguous().to(device).requires_grad_()
    targets = targets.to(device)
    with (
        watching({"all_reduce"}, NEVER_THE_LOGITS) as forward,
        noticing_calls(_library_answers()) as used,
    ):
        loss = fn(shard, targets, rank * (vocab // t), group)
    if used:
        return {"library": used}
    finite = (
        isinstance(loss, torch.Tensor) and loss.numel() == 1 and bool(torch.isfinite(loss).all())
    )
    result = {"library": [], "finite": finite, "loss": loss.item() if finite else float("nan")}
    result["detached"] = finite and not loss.requires_grad
    if finite and loss.requires_grad:
        with watching({"all_reduce"}, NEVER_THE_LOGITS) as backward:
            loss.backward()
        result["backward"] = backward.summary()
        result["grad"] = _gap(shard.grad, full.grad.chunk(t, -1)[rank].to(device))
    result.update(want=want_loss, forward=forward.summary(), logit_bytes=logits.numel() * 4)
    return result


@exercise(
    "tensor_parallel.vocab_parallel_cross_entropy",
    title="Vocabulary-parallel cross-entropy",
    world_size=2,
)
def grade_vocab_parallel_cross_entropy(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(logits, targets, vocab_start, group)``: the mean loss, never gathering the logits."""
    t, sent_at = cluster.world_size, {}
    for vocab in VOCABS:
        results = cluster.run(_cross_entropy_on_rank, fn, vocab)
        for rank, r in enumerate(results):
            _refuse_library(r["library"], "the vocabulary-parallel loss")
            if not r["finite"]:
                raise AssertionError(
                    f"rank {rank}: the loss is not one finite number. Logits here reach ±100, where "
                    "exp overflows fp32 (and one shared max underflows the rest): subtract each "
                    "TOKEN's max over the whole vocabulary — dist.all_reduce(op=ReduceOp.MAX) of "
                    "the local maxima — before exp, and return the mean over tokens"
                )
            if abs(r["loss"] - r["want"]) > LOSS_TOLERANCE:
                raise AssertionError(
                    f"rank {rank}, vocabulary {vocab}: loss {r['loss']:.6f}, but F.cross_entropy "
                    f"of the full logits is {r['want']:.6f}. Per token: m = max over ALL ranks "
                    "(op=MAX), S = Σ exp(z - m) over all ranks (SUM), the target's z_y - m from "
                    "the one rank that owns y, 0 elsewhere (SUM); loss = log S - (z_y - m)"
                )
            if r["detached"]:
                raise AssertionError(
                    f"rank {rank}: the loss is right but carries no gradient: autograd must reach "
                    "the logits (compute the loss from them, or write a torch.autograd.Function)"
                )
            if r["grad"] > GRAD_TOLERANCE:
                raise AssertionError(
                    f"rank {rank}: the loss is right but dL/dlogits is off by {r['grad']:.3g}. It "
                    "is (softmax - one-hot)/n on this rank's slice, softmax = exp(z - m)/S with "
                    "the GLOBAL S, and needs no communication. Every rank computes the same loss, "
                    "so no gradient may be summed over ranks (a differentiable all-reduce does "
                    "that); the surest way is a torch.autograd.Function with backward written out"
                )
            if r["backward"]["collectives"] or r["backward"]["p2p_bytes_sent"]:
                raise NotTheSkill(
                    f"rank {rank}'s backward ran {_calls(r['backward'])}: the gradient "
                    "(softmax - one-hot)/n is local to each rank's slice — backward moves nothing"
                )
        sent_at[vocab] = [_sent(r["forward"], t) for r in results]
    small, large = VOCABS
    ceiling = 3 * 2 * (t - 1) / t * TOKENS * 8  # three all-reduces of one fp64 number per token
    for rank, (few, many) in enumerate(zip(sent_at[small], sent_at[large], strict=True)):
        if few != many or many > ceiling:
            raise NotTheSkill(
                f"rank {rank} sent {few:,.0f} B at vocabulary {small} and {many:,.0f} B at "
                f"{large}: the bytes must not depend on the vocabulary, and three all-reduces of "
                f"one number per token is at most {ceiling:,.0f} B here. Move the max, the sum of "
                "exp and the target logit — never the logits"
            )
    gather = (t - 1) / t * TOKENS * large * 4
    return GradeResult(
        True,
        f"On {t} ranks the loss equals F.cross_entropy of the full logits at vocabularies {small} "
        f"and {large}, gradients included; each rank sent {sent_at[large][0]:,.0f} B at both "
        f"sizes (gathering the logits would send {gather:,.0f} B at {large}), and backward "
        "moved nothing.",
        {"bytes per rank": f"{sent_at[large][0]:,.0f}", "all-gather of logits": f"{gather:,.0f}"},
    )
