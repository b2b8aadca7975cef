"""Lab 09's graders: a derived byte count and a hand-written recompute pass; the library's
answers, torch's checkpoint, forgotten terms, forgotten RNG handling and a wrapper that saves
everything fail with a message that says what to change."""

from __future__ import annotations

import torch
import torch.utils.checkpoint as ckpt

from dtlab.memory.activation_families import lab_layer_families
from dtlab.models import GPTConfig
from dtlab.parallel.activations.recomputation import recompute as library_recompute
from dtlab.quiz import check_exercise
from dtlab.quiz.graders.activations import _recompute_on_rank


def hand_layer_bytes(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes, causal_mask=True):
    e, m = 4, 1 if dropout else 0
    sbh, scores = seq * batch * d_model, n_heads * seq * seq * batch
    total = 2 * sbh * e + 16 * seq * batch  # LayerNorm inputs; their fp32 mean and rstd
    total += 4 * sbh * e  # the q/k/v input once, then q, k, v
    total += scores * e + m * scores * (mask_bytes + e)  # softmax; dropout mask and output
    total += sbh * e + m * sbh * mask_bytes  # out_proj input, residual dropout mask
    total += (sbh + 2 * seq * batch * d_ff) * e + m * sbh * mask_bytes  # MLP
    return total + (seq * seq if causal_mask else 0)


def test_a_derived_layer_count_passes(cluster2):
    assert check_exercise("activations.layer_bytes", hand_layer_bytes, cluster2, record=False)


def test_forgetting_the_causal_mask_fails_with_a_hint(cluster2):
    def no_mask(*args):
        return hand_layer_bytes(*args, causal_mask=False)

    result = check_exercise("activations.layer_bytes", no_mask, cluster2, record=False)
    assert not result and "causal mask" in result.message


def test_the_library_count_is_refused(cluster2):
    def library(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes):
        config = GPTConfig(8, seq, d_model, 1, n_heads, d_ff, 0.1 if dropout else 0.0)
        return sum(lab_layer_families(config, batch, seq, mask_bytes=mask_bytes).values())

    result = check_exercise("activations.layer_bytes", library, cluster2, record=False)
    assert not result and "lab_layer_families" in result.message


def make_recompute(restore_rng=True, fork=True):
    def wrapper(function, *args):
        class Recompute(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                ctx.rng = torch.get_rng_state()
                ctx.save_for_backward(*inputs)
                with torch.no_grad():
                    return function(*inputs)

            @staticmethod
            def backward(ctx, grad):
                inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
                with torch.random.fork_rng(devices=[], enabled=fork):
                    if restore_rng:
                        torch.set_rng_state(ctx.rng)
                    with torch.enable_grad():
                        out = function(*inputs)
                torch.autograd.backward(out, grad)
                return tuple(t.grad if t.requires_grad else None for t in inputs)

        return Recompute.apply(*args)

    return wrapper


def test_a_hand_written_recompute_passes(cluster2):
    assert check_exercise("activations.recompute", make_recompute(), cluster2, record=False)


def test_a_recompute_that_redraws_dropout_differently_fails(cluster2):
    result = check_exercise(
        "activations.recompute", make_recompute(restore_rng=False), cluster2, record=False
    )
    assert not result and "same masks" in result.message


def test_a_recompute_that_moves_the_global_rng_fails(cluster2):
    result = check_exercise(
        "activations.recompute", make_recompute(fork=False), cluster2, record=False
    )
    assert not result and "fork_rng" in result.message


def test_a_wrapper_that_keeps_the_activations_fails(cluster2):
    def plain_call(function, *args):
        return function(*args)

    result = check_exercise("activations.recompute", plain_call, cluster2, record=False)
    assert not result and "more than the inputs" in result.message


def test_torch_checkpoint_and_the_library_recompute_are_refused(cluster2):
    for answer, name in (
        (lambda f, *a: ckpt.checkpoint(f, *a, use_reentrant=False), "torch.utils.checkpoint"),
        (
            lambda f, *a: library_recompute(f, *a),
            "dtlab.parallel.activations.recomputation.recompute",
        ),
    ):
        result = check_exercise("activations.recompute", answer, cluster2, record=False)
        assert not result and name in result.message


def hidden_saves(function, *args):
    """Plain autograd behind the learner's own saved-tensor hooks (which hide the saves from
    the grader's meter), plus an extra forward under no_grad so the block "runs twice"."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        function(*args)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        return function(*args)


def kept_and_rerun(function, *args):
    """Keeps the whole forward graph (hooks hide it) and re-runs the function in backward for
    show, its result thrown away."""
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        out = function(*args)

    class Rerun(torch.autograd.Function):
        @staticmethod
        def forward(ctx, o):
            return o.view_as(o)

        @staticmethod
        def backward(ctx, grad):
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                function(*(a.detach() for a in args))
            return grad

    return Rerun.apply(out)


def test_saved_tensor_hooks_that_keep_the_activations_are_caught(cluster2):
    for cheat in (hidden_saves, kept_and_rerun):
        result = check_exercise("activations.recompute", cheat, cluster2, record=False)
        assert not result and "still alive" in result.message, cheat.__name__
    problems = _recompute_on_rank(hidden_saves)["problems"]  # in this process, every message
    assert any("0 time(s) during backward" in p for p in problems), problems


def test_offloading_instead_of_recomputing_is_refused(cluster2):
    def offload(function, *args):
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            function(*args)
        with torch.autograd.graph.save_on_cpu():
            return function(*args)

    result = check_exercise("activations.recompute", offload, cluster2, record=False)
    assert not result and "save_on_cpu" in result.message


def ticket_recompute(function, *args):
    """The non-reentrant design (torch.utils.checkpoint's) written by hand: the forward keeps
    tickets instead of tensors, the first unpack in backward re-runs the function."""
    import itertools

    rng = torch.get_rng_state()

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, anchor, *inputs):
            ctx.save_for_backward(*inputs)
            return anchor.view_as(anchor)

        @staticmethod
        def backward(ctx, grad):
            return (grad, *([None] * (len(ctx.needs_input_grad) - 1)))

    keeper = Keep.apply(torch.zeros((), requires_grad=True), *args)
    tickets, store = itertools.count(), {}

    def unpack(ticket):
        if ticket not in store:
            inputs = [
                t.detach().requires_grad_(t.requires_grad) for t in keeper.grad_fn.saved_tensors
            ]
            again = itertools.count()
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(rng)
                with (
                    torch.enable_grad(),
                    torch.autograd.graph.saved_tensors_hooks(
                        lambda t: store.__setitem__(next(again), t.detach()), lambda _: None
                    ),
                ):
                    function(*inputs)
        return store.pop(ticket)

    with torch.autograd.graph.saved_tensors_hooks(lambda t: next(tickets), unpack):
        return function(*args)


def test_a_hand_written_non_reentrant_recompute_passes(cluster2):
    result = check_exercise("activations.recompute", ticket_recompute, cluster2, record=False)
    assert result, result.message


def test_measuring_a_block_with_raw_hooks_is_refused(cluster2):
    def measured(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes):
        from dtlab.models import GPT

        config = GPTConfig(8, seq, d_model, 1, n_heads, d_ff, 0.1 if dropout else 0.0)
        block = GPT(config, seed=0).blocks[0].train()
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(torch.randn(batch, seq, d_model, requires_grad=True), torch.arange(seq))
        return sum(storages.values())

    result = check_exercise("activations.layer_bytes", measured, cluster2, record=False)
    assert not result and "measuring" in result.message
