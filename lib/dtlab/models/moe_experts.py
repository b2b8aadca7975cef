"""The experts of a mixture-of-experts layer as batched weights, computed two ways.

``E`` experts, each ``fc_out(GELU(fc_in(x)))`` without biases (as in Mixtral and DeepSeek), live
in two tensors: ``fc_in.weight`` (E, d, h) and ``fc_out.weight`` (E, h, d). The rows given to
:meth:`Experts.forward` are grouped by expert (``counts[e]`` rows for expert ``e``, in order):

* ``"grouped"`` — one ``torch._grouped_mm`` per matrix: a single kernel walks the groups by their
  offsets (what production MoE kernels do; no Python loop, no padding);
* ``"loop"`` — one matmul per expert over its slice: ``E`` small kernels, the textbook version.

Both compute the same values. ``torch._grouped_mm`` is a private op: it exists from torch 2.8;
which dtypes and devices it takes varies by version and GPU (fp32/bf16/fp16 on CPU in recent
versions, bf16 on CUDA from sm90). It also refuses some operands on every device: each row
stride must be a multiple of 16 bytes, so ``d`` and ``hidden`` must be multiples of 4 in fp32
and of 8 in bf16/fp16 (``d = 30`` in fp32 is 120-byte rows: refused, on CPU as on CUDA).

``"auto"`` decides on every call (:func:`grouped_mm_refusal`): the kernel runs this dtype on this
device (probed once, :func:`grouped_mm_available`), and these operands' widths, strides and base
addresses suit it — else the loop runs. The module records what ran, and why the loop ran
instead: ``experts.last_backend`` and ``experts.fallback_reason``. Asking for ``"grouped"`` where
the kernel refuses is an error that gives the reason.

Why fall back rather than pad ``d`` and ``hidden`` to an aligned width: padding gives the same
values (zero rows and columns add only zero products) but copies both expert weight tensors,
``2·E·d·hidden`` elements, on every call, to save ``E`` small matmuls on widths that production
models avoid anyway; the loop copies nothing and is the textbook version.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

BACKENDS = ("auto", "grouped", "loop")


def grouped_mm_available(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """Whether ``torch._grouped_mm`` exists in this torch and runs ``dtype`` on ``device``, forward
    and backward: probed once per (dtype, device type) on a tiny aligned problem, so a torch
    (or GPU) without the kernel falls back to the loop instead of failing mid-training."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    return _grouped_mm_runs(dtype, torch.device(device).type)


@functools.cache
def _grouped_mm_runs(dtype: torch.dtype, device_type: str) -> bool:
    try:  # whatever the caller's grad mode (the first call may come under no_grad)
        with torch.inference_mode(False), torch.enable_grad():
            x = torch.ones(32, 16, dtype=dtype, device=device_type, requires_grad=True)
            w = torch.ones(2, 16, 16, dtype=dtype, device=device_type, requires_grad=True)
            offs = torch.tensor([16, 32], dtype=torch.int32, device=device_type)
            torch._grouped_mm(x, w, offs=offs).square().sum().backward()
    except Exception:  # noqa: BLE001 - any refusal (no kernel, dtype, device) means "no"
        return False
    return True


def grouped_mm_refusal(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> str | None:
    """Why ``torch._grouped_mm`` cannot run ``x @ w_in`` then ``· @ w_out`` (forward and
    backward) on these operands, or ``None`` when it can. Checked per call, in this order:

    1. the kernel runs ``x.dtype`` on ``x.device`` in this torch (:func:`grouped_mm_available`);
    2. widths: every matrix of forward and backward has rows of ``d`` or ``hidden`` elements
       (inputs, the hidden activation, their gradients), and the kernel wants every row stride a
       multiple of 16 bytes, so ``d · e`` and ``hidden · e`` must be (``e`` bytes per element);
    3. each operand (``x``, ``w_in``, ``w_out``) is contiguous along one of its last two
       dimensions, the other stride a multiple of 16 bytes (the kernel's own layout rule);
    4. each operand starts on a 16-byte boundary (CUDA's kernel requires it; some torch
       versions check it on CPU too, so it is asked everywhere).
    """
    if not grouped_mm_available(x.dtype, x.device):
        return (
            f"torch {torch.__version__} has no torch._grouped_mm for {x.dtype} on {x.device.type}"
        )
    e = x.element_size()
    for name, width in (("d_model", x.shape[-1]), ("d_hidden", w_in.shape[-1])):
        if width * e % 16:
            return (
                f"{name}={width} {_dtype_name(x.dtype)} values make {width * e}-byte rows, not a "
                f"multiple of 16 bytes (choose a multiple of {16 // e})"
            )
    for name, t in (("the rows", x), ("fc_in.weight", w_in), ("fc_out.weight", w_out)):
        problem = _layout_problem(t)
        if problem:
            return f"{name}: {problem}"
    return None


def _layout_problem(t: torch.Tensor) -> str | None:
    # torch's check_valid_strides_and_return_transposed, in words (GroupedMMUtils.h).
    if t.data_ptr() % 16:
        return f"starts {t.data_ptr() % 16} bytes past a 16-byte boundary"
    rows, cols = t.stride(-2), t.stride(-1)
    if rows == 1 and cols >= max(1, t.shape[-2]):
        lead = cols
    elif cols == 1 and rows >= max(1, t.shape[-1]):
        lead = rows
    else:
        return f"strides {tuple(t.stride())} are contiguous in neither of the last two dimensions"
    if lead * t.element_size() % 16:
        return f"rows {lead * t.element_size()} bytes apart, not a multiple of 16"
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Weight(nn.Module):
    """A holder, so the parameter is named ``…fc_in.weight`` / ``…fc_out.weight`` and the GPT's
    initialisation rule (``fc_out`` scaled by ``1/√(2·n_layers)``) applies to experts too."""

    def __init__(self, *shape: int, device=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape, device=device))
        nn.init.normal_(self.weight, 0.0, 0.02)


def _contiguous_grad(t: torch.Tensor) -> torch.Tensor:
    # _grouped_mm's backward refuses an expanded (stride-0) gradient such as that of .sum().
    if t.requires_grad:
        t.register_hook(lambda g: g.contiguous())
    return t


class Experts(nn.Module):
    """``n_experts`` GELU MLPs ``d → d_hidden → d`` as batched weights (see module docstring)."""

    def __init__(
        self,
        n_experts: int,
        d_model: int,
        d_hidden: int,
        backend: str = "auto",
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"experts backend {backend!r}: choose one of {BACKENDS}")
        self.backend = backend
        self.fc_in = _Weight(n_experts, d_model, d_hidden, device=device)
        self.fc_out = _Weight(n_experts, d_hidden, d_model, device=device)
        self.last_backend: str | None = None  # what the latest forward ran
        self.fallback_reason: str | None = None  # why "auto" ran the loop there

    @property
    def n_experts(self) -> int:
        """Experts held here (all of them, or this rank's share under expert parallelism)."""
        return self.fc_in.weight.shape[0]

    def resolved_backend(self, x: torch.Tensor) -> str:
        """``"grouped"`` or ``"loop"``: what ``forward`` runs for ``x`` (decided per call)."""
        return self._choose(x)[0]

    def _choose(self, x: torch.Tensor) -> tuple[str, str | None]:
        if self.backend == "loop":
            return "loop", None
        refusal = grouped_mm_refusal(x, self.fc_in.weight, self.fc_out.weight)
        if refusal is None:
            return "grouped", None
        if self.backend == "grouped":
            raise ValueError(
                f"backend='grouped': torch._grouped_mm refuses these operands: {refusal}; use "
                "backend='loop' (or 'auto', which falls back by itself)"
            )
        return "loop", refusal

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows ``x`` (N, d) grouped by expert, ``counts[e]`` rows each → outputs (N, d).

        Sets ``last_backend`` (what ran) and ``fallback_reason`` (why ``"auto"`` ran the loop;
        ``None`` when the grouped GEMM ran or the loop was asked for)."""
        if len(counts) != self.n_experts or sum(counts) != x.shape[0]:
            raise ValueError(
                f"counts {counts} must give one row count per expert ({self.n_experts}) summing "
                f"to the {x.shape[0]} rows"
            )
        w_in, w_out = self.fc_in.weight, self.fc_out.weight
        self.last_backend, self.fallback_reason = self._choose(x)
        if self.last_backend == "grouped":
            offsets = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            hidden = F.gelu(
                _contiguous_grad(torch._grouped_mm(x, w_in, offs=offsets)), approximate="tanh"
            )
            return _contiguous_grad(torch._grouped_mm(hidden, w_out, offs=offsets))
        outs = []
        for e, rows in enumerate(x.split(counts)):
            outs.append(F.gelu(rows @ w_in[e], approximate="tanh") @ w_out[e])
        return torch.cat(outs) if outs else x.new_zeros(0, w_out.shape[-1])
