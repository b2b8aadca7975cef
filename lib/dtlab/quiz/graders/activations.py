"""Graders for lab 09 (activation memory): a layer's saved bytes, and recomputation from scratch.

``activations.layer_bytes`` — ``fn(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes) ->
int``: the bytes one lab-GPT block (fp32, multi-head attention, the default attention core) saves
for backward while training, ``dropout`` a bool, ``mask_bytes`` the bytes per element of a saved
dropout mask on this device. Graded on every rank against what the saved-tensor hooks
(:class:`~dtlab.memory.ActivationMeter`) *measure* on a real block on the rank's device, for
several shapes with dropout on and off — the measurement is the key, not the library's formula.
Calling the library's counts (``lab_layer_families``, the TP accounting) or measuring inside
``fn`` (``ActivationMeter``, saved-tensor hooks, running a lab-GPT block) is refused: the skill is
the derivation.

``activations.recompute`` — ``fn(function, *args) -> output``: run ``function(*args)`` keeping
only the tensor inputs for backward and re-running it in backward. Graded on every rank on a
chain of two lab-GPT blocks with dropout, one region each, and on a closure over a weight: the
gradients (inputs and parameters) must equal plain autograd's bit for bit (so the dropout masks must be redrawn from the restored
RNG state), the global RNG must be left as plain training leaves it (re-run inside
``torch.random.fork_rng``), nothing but the inputs may be saved in the forward pass, and the
blocks must really run again *during backward*. What the forward pass leaves alive is counted
twice: by the meter's saved-tensor hooks, and — because a wrapper's own hooks hide its saves from
the meter's — by weak references to every storage an op created (:class:`~dtlab.quiz.graders.watch.StorageBirths`), so hooks
that keep or copy the activations are caught. ``torch.utils.checkpoint`` (and its internals, its
op-level policy), ``save_on_cpu`` and dtlab's ``recompute`` are refused: the exercise is to write
it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtlab.quiz.exercises import GradeResult, NotTheSkill, exercise
from dtlab.quiz.graders.watch import StorageBirths, noticing_calls

LAYER_CASES = (  # (batch, seq, d_model, n_heads, d_ff); seq, d_model and head_dim all differ
    (2, 24, 32, 4, 128),
    (1, 40, 64, 8, 96),
    (3, 12, 16, 2, 64),
)


def _count_answers() -> dict[Callable, str]:
    import torch

    from dtlab.memory import activation_families, activations
    from dtlab.models.gpt import Block
    from dtlab.parallel.tensor import accounting

    return {
        Block.forward: "a lab-GPT block's forward (measuring)",
        torch.autograd.graph.saved_tensors_hooks.__init__: "torch.autograd.graph."
        "saved_tensors_hooks (measuring)",
        activation_families.lab_layer_families: "dtlab.memory.activation_families."
        "lab_layer_families",
        activation_families.measured_families: "dtlab.memory.activation_families.measured_families",
        accounting.activation_bytes_per_layer: "dtlab.parallel.tensor.accounting."
        "activation_bytes_per_layer",
        activations.ActivationMeter.__init__: "dtlab.memory.ActivationMeter",
    }


def _recompute_answers() -> dict[Callable, str]:
    import torch
    import torch.utils.checkpoint as ckpt

    from dtlab.parallel.activations import op_level_checkpointing, recomputation

    answers = {
        ckpt.checkpoint: "torch.utils.checkpoint.checkpoint",
        ckpt.checkpoint_sequential: "torch.utils.checkpoint.checkpoint_sequential",
        recomputation.recompute: "dtlab.parallel.activations.recomputation.recompute",
        recomputation._Region.__init__: "dtlab.parallel.activations.recomputation (its _Region)",
        op_level_checkpointing.checkpoint_saving_matmuls: "dtlab.parallel.activations."
        "op_level_checkpointing.checkpoint_saving_matmuls",
        torch.autograd.graph.save_on_cpu.__init__: "torch.autograd.graph.save_on_cpu "
        "(offloading, not recomputation)",
    }
    for name in ("CheckpointFunction", "_checkpoint_without_reentrant_generator"):
        found = getattr(ckpt, name, None)
        if found is not None:
            answers[getattr(found, "forward", found)] = f"torch.utils.checkpoint.{name}"
    return answers


def _measured_block_bytes(case: tuple, dropout: float) -> tuple[int, int]:
    import torch

    import dtlab
    from dtlab.memory import ActivationMeter
    from dtlab.memory.activation_families import dropout_mask_bytes
    from dtlab.models import GPT, GPTConfig

    batch, seq, d, heads, d_ff = case
    device = dtlab.device()
    config = GPTConfig(
        vocab_size=8, seq_len=seq, d_model=d, n_layers=1, n_heads=heads, d_ff=d_ff,
        dropout=dropout,
    )  # fmt: skip
    block = GPT(config, seed=0, device=device).blocks[0].train()
    x = torch.randn(batch, seq, d, device=device, requires_grad=True)
    with ActivationMeter(block) as meter:
        y = block(x, torch.arange(seq, device=device))
    del y
    return meter.total_bytes, dropout_mask_bytes(device, 4)


def _layer_bytes_on_rank(fn: Callable) -> dict:
    problems, used = [], []
    for case in LAYER_CASES:
        for dropout in (0.0, 0.1):
            want, mask_bytes = _measured_block_bytes(case, dropout)
            args = (*case, dropout > 0, mask_bytes)
            with noticing_calls(_count_answers()) as noticed:
                try:
                    got = fn(*args)
                except NotImplementedError:
                    raise
                except Exception as error:  # noqa: BLE001 - reported to the learner
                    problems.append(f"fn{args} raised {error!r}")
                    continue
            used += noticed
            if got != want:
                problems.append(
                    f"batch={case[0]}, seq={case[1]}, d_model={case[2]}, n_heads={case[3]}, "
                    f"d_ff={case[4]}, dropout={dropout > 0}, mask_bytes={mask_bytes}: you "
                    f"said {got!r} B, the block saved {want:,} B (measured)"
                    + _layer_hint(got, want, case)
                )
    return {"problems": problems, "used": used}


def _layer_hint(got: Any, want: int, case: tuple) -> str:
    if not isinstance(got, int):
        return "; return an int"
    b, s, h, a, _ = case
    for what, size in (
        ("the causal mask (s² bytes, one bool per query-key pair)", s * s),
        ("the LayerNorm mean and rstd (4 fp32 tensors of s·b)", 16 * s * b),
        ("the layer's input to q/k/v, counted once although three Linears save it", s * b * h * 4),
    ):
        if abs(want - got) == size:
            return f" — off by exactly {size:,} B: {what}"
    return " — list what each op saves (see the table above the exercise)"


@exercise("activations.layer_bytes", title="A layer's activation bytes", world_size=2)
def grade_layer_bytes(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(batch, seq, d_model, n_heads, d_ff, dropout, mask_bytes) -> int`` (module doc)."""
    results = cluster.run(_layer_bytes_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your count calls {r['used'][0]} — that is the answer, not the derivation. "
                "Add up what each op saves: LayerNorm inputs, the q/k/v input, q, k, v, the "
                "softmax output, ..."
            )
    for rank, r in enumerate(results):
        if r["problems"]:
            more = f" (and {len(r['problems']) - 1} more)" if len(r["problems"]) > 1 else ""
            raise AssertionError(f"on rank {rank}: {r['problems'][0]}{more}")
    return GradeResult(
        True,
        f"Exact on {cluster.world_size} ranks: your count equals the bytes a real block saved "
        f"for backward (measured by saved-tensor hooks) for {len(LAYER_CASES)} shapes, with "
        "dropout on and off.",
    )


def _recompute_on_rank(fn: Callable) -> dict:
    import torch

    import dtlab
    from dtlab.memory import ActivationMeter
    from dtlab.models import GPT, GPTConfig

    device = dtlab.device()
    config = GPTConfig(vocab_size=8, seq_len=16, d_model=32, n_layers=2, n_heads=4, dropout=0.2)
    problems, used = [], []

    def run(recomputed: bool) -> dict:
        blocks = GPT(config, seed=0, device=device).blocks.train()
        phase = ["forward"]
        calls = {"forward": 0, "backward": 0}

        def count(*_: Any) -> None:
            calls[phase[0]] += 1

        for block in blocks:
            block.register_forward_hook(count)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 16, 32, generator=g).to(device).requires_grad_()
        positions = torch.arange(16, device=device)
        torch.manual_seed(7)
        births = StorageBirths()
        with ActivationMeter(blocks) as meter:  # two regions: one block each
            if recomputed:
                with noticing_calls(_recompute_answers()) as noticed, births.mode:
                    y = fn(blocks[1], fn(blocks[0], x, positions), positions)
                used.extend(noticed)
            else:
                y = blocks[1](blocks[0](x, positions), positions)
        # What the forward pass left alive besides its output (views of the parameters and
        # the inputs are outputs of ops too, but not new storage).
        kept = births.alive_bytes(y, x, positions, *blocks.parameters(), *blocks.buffers())
        phase[0] = "backward"
        y.square().sum().backward()
        return {
            "grads": [x.grad] + [p.grad for p in blocks.parameters()],
            "next": torch.rand(3),
            "saved": meter.total_bytes,
            "kept": kept,
            "inputs": 2 * x.numel() * 4 + positions.numel() * 8,  # x, block 0's output
            "calls": calls,
        }

    plain = run(False)
    try:
        ours = run(True)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - reported to the learner
        return {"problems": [f"fn(block, x, positions) raised {error!r}"], "used": used}
    if any(g is None for g in ours["grads"]):
        problems.append("some gradients are None: the parameters' gradients must reach .grad")
    elif not all(torch.equal(a, b) for a, b in zip(ours["grads"], plain["grads"], strict=True)):
        problems.append(
            "gradients differ from plain autograd: with dropout the re-run must draw the same "
            "masks — save torch.get_rng_state() in forward and set it before re-running"
        )
    if not torch.equal(ours["next"], plain["next"]):
        problems.append(
            "after backward the global RNG is not where plain training leaves it: re-run inside "
            "torch.random.fork_rng() so the backward draws nothing"
        )
    if ours["saved"] > ours["inputs"]:
        problems.append(
            f"the forward pass saved {ours['saved']:,} B for backward, more than the inputs "
            f"({ours['inputs']:,} B): run the function under torch.no_grad() in forward"
        )
    if ours["kept"] > ours["inputs"]:
        problems.append(
            f"after the forward pass {ours['kept']:,} B created by it are still alive besides "
            f"its output, more than the inputs ({ours['inputs']:,} B): keep only the inputs "
            "(saved-tensor hooks that keep or copy the tensors keep the activations too)"
        )
    if ours["calls"]["backward"] < 2:
        problems.append(
            f"the blocks re-ran {ours['calls']['backward']} time(s) during backward, not once "
            "each: backward must re-run the function to rebuild its graph"
        )

    w = torch.randn(8, 8, device=device, requires_grad=True)
    v = torch.randn(4, 8, device=device, requires_grad=True)
    try:
        out = fn(lambda t: torch.tanh(t @ w) @ w, v)
        out.sum().backward()
        want_v, want_w = torch.autograd.grad((torch.tanh(v @ w) @ w).sum(), (v, w))
        if w.grad is None:
            problems.append(
                "fn(lambda t: tanh(t @ w) @ w, v): the weight w the function closes over got no "
                "gradient — backpropagate through the whole re-run graph (torch.autograd."
                "backward), not only to the inputs"
            )
        elif not (torch.allclose(v.grad, want_v) and torch.allclose(w.grad, want_w)):
            problems.append("fn(lambda t: tanh(t @ w) @ w, v): the gradients of v or w are wrong")
    except Exception as error:  # noqa: BLE001 - reported to the learner
        problems.append(f"fn(lambda t: tanh(t @ w) @ w, v) raised {error!r}")
    return {"problems": problems, "used": used}


@exercise("activations.recompute", title="Recomputation from scratch", world_size=2)
def grade_recompute(fn: Callable, cluster: Any) -> GradeResult:
    """``fn(function, *args) -> output``: recompute in backward, bit-exact (module doc)."""
    results = cluster.run(_recompute_on_rank, fn)
    for r in results:
        if r["used"]:
            raise NotTheSkill(
                f"your wrapper calls {r['used'][0]} — the exercise is to write it: a "
                "torch.autograd.Function whose forward runs under no_grad and whose backward "
                "re-runs with grad enabled on the saved inputs"
            )
    for rank, r in enumerate(results):
        if r["problems"]:
            more = f" (and {len(r['problems']) - 1} more)" if len(r["problems"]) > 1 else ""
            raise AssertionError(f"on rank {rank}: {r['problems'][0]}{more}")
    return GradeResult(
        True,
        f"On {cluster.world_size} ranks: two recomputed dropout blocks' gradients equal plain "
        "autograd's bit for bit, the RNG ends where plain training leaves it, only the inputs "
        "are saved in forward, each block re-runs in backward, and a closure's weight gets its "
        "gradient.",
    )
