"""The experts of a mixture-of-experts layer as batched weights, computed two ways.

``E`` experts, each ``fc_out(GELU(fc_in(x)))`` without biases (as in Mixtral and DeepSeek), live
in two tensors: ``fc_in.weight`` (E, d, h) and ``fc_out.weight`` (E, h, d). The rows given to
:meth:`Experts.forward` are grouped by expert (``counts[e]`` rows for expert ``e``, in order):

* ``"grouped"`` — one ``torch._grouped_mm`` per matrix: a single kernel walks the groups by their
  offsets (what production MoE kernels do; no Python loop, no padding);
* ``"loop"`` — one matmul per expert over its slice: ``E`` small kernels, the textbook version.

Both compute the same values. ``torch._grouped_mm`` is a private op: it exists from torch 2.8;
which dtypes and devices it takes varies by version and GPU (fp32/bf16/fp16 on CPU in recent
versions, bf16 on CUDA from sm90). :func:`grouped_mm_available` probes whether it runs here (forward
and backward), and ``"auto"`` picks it when it does and the shapes suit it, else the loop.
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


def grouped_mm_fits(x: torch.Tensor, hidden: int) -> bool:
    """Whether the shapes suit ``torch._grouped_mm`` on this device: CUDA's kernel wants every
    row stride a multiple of 16 bytes (``d`` and ``hidden`` times the element size)."""
    if x.device.type != "cuda":
        return True
    return all(n * x.element_size() % 16 == 0 for n in (x.shape[-1], hidden))


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

    @property
    def n_experts(self) -> int:
        """Experts held here (all of them, or this rank's share under expert parallelism)."""
        return self.fc_in.weight.shape[0]

    def resolved_backend(self, x: torch.Tensor) -> str:
        """``"grouped"`` or ``"loop"``: what ``forward`` runs for ``x``."""
        if self.backend != "auto":
            return self.backend
        hidden = self.fc_in.weight.shape[-1]
        if grouped_mm_available(x.dtype, x.device) and grouped_mm_fits(x, hidden):
            return "grouped"
        return "loop"

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows ``x`` (N, d) grouped by expert, ``counts[e]`` rows each → outputs (N, d)."""
        if len(counts) != self.n_experts or sum(counts) != x.shape[0]:
            raise ValueError(
                f"counts {counts} must give one row count per expert ({self.n_experts}) summing "
                f"to the {x.shape[0]} rows"
            )
        w_in, w_out = self.fc_in.weight, self.fc_out.weight
        if self.resolved_backend(x) == "grouped":
            if not grouped_mm_available(x.dtype, x.device):
                raise ValueError(
                    f"torch._grouped_mm cannot run {x.dtype} on {x.device.type} in torch "
                    f"{torch.__version__}; use backend='loop' (or 'auto')"
                )
            offsets = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            hidden = F.gelu(
                _contiguous_grad(torch._grouped_mm(x, w_in, offs=offsets)), approximate="tanh"
            )
            return _contiguous_grad(torch._grouped_mm(hidden, w_out, offs=offsets))
        outs = []
        for e, rows in enumerate(x.split(counts)):
            outs.append(F.gelu(rows @ w_in[e], approximate="tanh") @ w_out[e])
        return torch.cat(outs) if outs else x.new_zeros(0, w_out.shape[-1])
