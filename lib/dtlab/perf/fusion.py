"""Fusion: the same arithmetic in fewer passes over memory.

RMSNorm (Zhang & Sennrich 2019), ``y = x · rsqrt(mean(x²) + ε) · w``, written as eager PyTorch
runs five kernels — ``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, ``mul`` — and each reads its
input from memory and writes its output back. For ``x`` of ``r × c`` elements of ``e`` bytes
that is about ``6·r·c·e`` bytes (:func:`rmsnorm_unfused_bytes`), all of it memory-bound
(a handful of FLOPs per element, far below any ridge point). A fused kernel reads ``x`` once and
writes ``y`` once: ``2·r·c·e`` (+ the weight) — :func:`rmsnorm_fused_bytes` — so on the roofline
it should take a third of the time.

Two fused forms, measured against the eager one (and against :func:`rmsnorm_eager_reusing`,
the eager ops with their buffers kept, which separates the cost of fresh memory from the cost
of bytes moved):

* :func:`rmsnorm_fused_by_hand` — *loop fusion by cache blocking*, written in PyTorch: the rows
  are processed in chunks small enough (``chunk_bytes``, 256 KiB) that every intermediate stays
  in the CPU's L2 cache; only ``x`` and ``y`` cross to DRAM. It pays Python and dispatch per
  chunk, which is why a compiler (or a hand-written CUDA/Triton kernel on a GPU) does better.
* ``torch.compile`` (TorchInductor) generates one C++ (CPU) or Triton (GPU) kernel for the whole
  expression. :func:`compile_and_measure` times its cold start (tracing + codegen + the C
  compiler), counts the kernels in the generated code, and times the warm call. On a CPU,
  Inductor needs a working C++ compiler (``g++``); where compilation fails the function returns
  the error instead of raising, so a lab can say what to install.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

EPS = 1e-6


def rmsnorm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm as six eager ops (each a pass over memory)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rmsnorm_eager_reusing(
    x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, work: dict | None = None
) -> torch.Tensor:
    """The same six eager ops writing into buffers kept from call to call (``work``).

    The traffic is :func:`rmsnorm_eager`'s; what differs is where the memory comes from. On a
    CPU each eager temporary of several MiB is fresh memory from the system allocator, which maps
    it and faults it in page by page on every call — a cost of *allocation*, not of bytes moved,
    and the one a caching allocator (PyTorch's on a GPU) removes. Comparing the fused forms with
    this one isolates the bytes."""
    work = {} if work is None else work
    if work.get("shape") != tuple(x.shape):
        rows = x.shape[0]
        work.update(shape=tuple(x.shape), sq=torch.empty_like(x), scaled=torch.empty_like(x),
                    out=torch.empty_like(x), mean=x.new_empty(rows, 1))  # fmt: skip
    torch.pow(x, 2, out=work["sq"])
    torch.mean(work["sq"], -1, keepdim=True, out=work["mean"])
    work["mean"].add_(eps).rsqrt_()
    torch.mul(x, work["mean"], out=work["scaled"])
    return torch.mul(work["scaled"], weight, out=work["out"])


def rmsnorm_fused_by_hand(
    x: torch.Tensor, weight: torch.Tensor, eps: float = EPS, chunk_bytes: int = 256 << 10
) -> torch.Tensor:
    """RMSNorm over row chunks that fit in cache: DRAM sees ``x`` read once and ``y`` written once.

    The intermediates (``x²``, the row means, ``x·rsqrt``) live in one reused chunk buffer."""
    rows, cols = x.shape
    step = max(1, chunk_bytes // (cols * x.element_size()))
    out = torch.empty_like(x)
    buf = torch.empty(step, cols, dtype=x.dtype, device=x.device)
    scale = torch.empty(step, 1, dtype=x.dtype, device=x.device)
    for start in range(0, rows, step):
        xc = x[start : start + step]
        n = xc.shape[0]
        torch.mul(xc, xc, out=buf[:n])
        torch.mean(buf[:n], -1, keepdim=True, out=scale[:n])
        scale[:n].add_(eps).rsqrt_()
        torch.mul(xc, scale[:n], out=buf[:n])
        torch.mul(buf[:n], weight, out=out[start : start + n])
    return out


def rmsnorm_unfused_bytes(rows: int, cols: int, bytes_per_element: int) -> int:
    """Eager RMSNorm's traffic, each op reading its inputs and writing its output once:
    ``pow`` 2n, ``mean`` n + r, ``add`` 2r, ``rsqrt`` 2r, ``mul`` 2n + r, ``mul`` 3n (x·w with
    the weight broadcast: its c elements read once) → ``(7n + 5r + c)·e`` with ``n = r·c``."""
    n = rows * cols
    return (2 * n + (n + rows) + 2 * rows + 2 * rows + (2 * n + rows) + (2 * n + cols)) * (
        bytes_per_element
    )


def rmsnorm_fused_bytes(rows: int, cols: int, bytes_per_element: int) -> int:
    """A fused RMSNorm's traffic: ``x`` read once, ``y`` written once, the weight read once."""
    return (2 * rows * cols + cols) * bytes_per_element


@dataclass(frozen=True)
class Compiled:
    """What compiling a function cost and produced; ``error`` set when compilation failed."""

    cold_start_s: float
    warm_call_s: float = 0.0
    kernels: int = 0
    kernel_names: tuple[str, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def _kernel_names(code: str) -> tuple[str, ...]:
    """Inductor's generated kernels (``cpp_fused_*`` on CPU, ``triton_*`` on GPU) and extern calls."""
    fused = re.findall(r"\b(cpp_fused_\w+|triton_\w+_fused_\w+|triton_\w+)\s*\(", code)
    extern = re.findall(r"extern_kernels\.(\w+)\(", code)
    return tuple(dict.fromkeys([*fused, *extern]))


def compile_and_measure(fn, *args, calls: int = 20) -> Compiled:
    """``torch.compile(fn)``: cold start (first call, timed), kernels in the generated code, and
    the warm call's best time. Never raises for a compiler failure: see :attr:`Compiled.error`."""
    from dtlab.perf.roofline import best_seconds

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    start = time.perf_counter()
    try:
        compiled = torch.compile(fn)
        code = _generated_code(compiled, *args)
    except Exception as error:  # noqa: BLE001 - Inductor raises many types; report, don't crash
        return Compiled(time.perf_counter() - start, error=f"{type(error).__name__}: {error}"[:600])
    cold = time.perf_counter() - start
    names = _kernel_names(code) if code else ()
    warm = best_seconds(lambda: compiled(*args), device, repeats=max(3, calls // 4))
    return Compiled(cold, warm, len(names), names)


def _generated_code(compiled, *args) -> str:
    """Call ``compiled`` once and return Inductor's generated source ("" where unavailable).

    ``torch._inductor.utils.run_and_get_code`` is private, so a failure to import or use it
    falls back to a plain call (the kernel count is then unknown, reported as 0)."""
    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError:
        compiled(*args)
        return ""
    _, code = run_and_get_code(compiled, *args)
    return "\n".join(code)


def c_compiler() -> str | None:
    """The C++ compiler Inductor would use on a CPU (``CXX``, else ``g++``/``c++``/``clang++``)."""
    import os
    import shutil

    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None
