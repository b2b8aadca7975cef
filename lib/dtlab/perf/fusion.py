"""Fusion: the same arithmetic in fewer passes over memory.

RMSNorm (Zhang & Sennrich 2019), ``y = x · rsqrt(mean(x²) + ε) · w``, written as eager PyTorch
runs six ops — ``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, ``mul`` — and each reads its
input from memory and writes its output back. For ``x`` of ``n = r × c`` elements of ``e`` bytes
that is ``(7n + 5r + c)·e`` bytes (:func:`rmsnorm_unfused_bytes`), all of it memory-bound
(a handful of FLOPs per element, far below any ridge point). A fully fused kernel reads ``x``
once and writes ``y`` once: ``(2n + c)·e`` — :func:`rmsnorm_fused_bytes` — so on the roofline it
should take ``2/7`` of the time.

Three forms are measured against the eager one (and against :func:`rmsnorm_eager_reusing`,
the eager ops with their buffers kept, which separates the cost of fresh memory from the cost
of bytes moved):

* :func:`rmsnorm_fewer_passes` — fusion *by hand in PyTorch*, as far as existing ATen kernels
  allow: ``torch.linalg.vector_norm`` computes ``Σx²`` in one reduction pass that writes only
  ``r`` values (no ``x²`` tensor), and the two multiplies write one output buffer, the second in
  place. ``(5n + 10r + c)·e`` bytes (:func:`rmsnorm_fewer_passes_bytes`): between eager and
  fully fused, because ATen has no kernel that multiplies by a row scale *and* a column weight
  in one pass. Only a generated or hand-written kernel (C++/Triton) reaches ``2n``.

  Cache blocking in PyTorch (rows in chunks small enough that the intermediates stay in cache)
  is deliberately not used: it dispatches ops per chunk — hundreds per call — and the census,
  which counts every op's traffic, counts *more* bytes for it than for eager, so its saving
  could not be shown as measured.
* ``torch.compile`` (TorchInductor) generates one C++ (CPU) or Triton (GPU) kernel for the whole
  expression. :func:`compile_and_measure` times its cold start (tracing + codegen + the C
  compiler), counts the kernels in the generated code, and times the warm call. Its bytes are
  **not measured** by dtlab: the dispatch census cannot see inside a generated kernel, and
  Inductor's own byte count (``torch._inductor.metrics.num_bytes_accessed``) stays 0 for CPU
  kernels — the lab prints :func:`rmsnorm_fused_bytes` as the formula's prediction. On a CPU,
  Inductor needs a working C++ compiler (``g++``); where compilation fails the function returns
  the error instead of raising, so a lab can say what to install.
* :func:`compare_step_compiled` does the same for a whole training step: ATen ops dispatched per
  step (``torch.profiler``) eager against compiled, the kernels Inductor generated, the cold
  start, and both steps' measured time.
"""

from __future__ import annotations

import math
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


def rmsnorm_fewer_passes(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm in five ``x``-sized reads and writes instead of eager's seven.

    ``vector_norm`` reads ``x`` once and writes the ``r`` row norms (``‖x‖² / c = mean(x²)``);
    the scale is finished on those ``r`` values in place; ``x · w`` writes ``y`` and ``y *= scale``
    rewrites it in place. No ``x``-sized temporary is allocated besides ``y``."""
    scale = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    scale.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    return torch.mul(x, weight).mul_(scale)


def rmsnorm_fewer_passes_bytes(rows: int, cols: int, bytes_per_element: int) -> int:
    """:func:`rmsnorm_fewer_passes`' traffic, each op reading its inputs and writing its output
    once: ``vector_norm`` n + r, four in-place ops on the ``r`` scales 2r each, ``mul`` 2n + c,
    ``mul_`` 2n + r → ``(5n + 10r + c)·e``."""
    n = rows * cols
    return ((n + rows) + 4 * 2 * rows + (2 * n + cols) + (2 * n + rows)) * bytes_per_element


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


def _generated_code_of(call) -> list[str]:
    """Run ``call()`` once; Inductor's generated source for every graph it compiled meanwhile
    (``[]`` where the private hook ``run_and_get_code`` is unavailable: counts are then 0)."""
    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError:
        call()
        return []
    return list(run_and_get_code(call)[1])


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


def compile_break_even_steps(
    cold_start_s: float, eager_step_s: float, compiled_step_s: float
) -> float:
    """Steps after which compiling has paid for its cold start: ``cold / (eager − compiled)``;
    ``math.inf`` when the compiled step is not faster (it never pays off)."""
    saved = eager_step_s - compiled_step_s
    return cold_start_s / saved if saved > 0 else math.inf


@dataclass(frozen=True)
class StepComparison:
    """One training step eager and compiled, every figure measured or counted on this machine.

    ``*_aten_ops``: ATen ops per step in ``torch.profiler`` (nested calls included); the
    compiled step's generated kernels run outside ATen, so they are not among them.
    ``kernels``: distinct kernels in Inductor's generated code (fused C++/Triton kernels and
    ``extern_kernels`` calls such as ``mm``), counted from the code; ``graphs``: how many
    graphs Inductor compiled (forward and backward each count). ``error`` when compile failed."""

    eager_aten_ops: int
    eager_s: float
    compiled_aten_ops: int = 0
    compiled_s: float = 0.0
    cold_start_s: float = 0.0
    kernels: int = 0
    graphs: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def aten_ops_per_step(step, steps: int = 1) -> int:
    """ATen ops ``step()`` dispatches, averaged over ``steps``, read from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return round(sum(e.name.startswith("aten::") for e in prof.events()) / steps)


def compare_step_compiled(eager_step, compiled_step, device, repeats: int = 5) -> StepComparison:
    """Eager against compiled: the compiled step's first call (the cold start: tracing, code
    generation, the C++ compiler, the backward's compile) timed and its generated code read,
    then ATen ops per step and the best step time of each. Never raises for a compiler failure.

    The two steps must start from equal states (built with the same seed) for their losses to
    be comparable; their times are comparable either way."""
    from dtlab.perf.roofline import best_seconds

    eager = StepComparison(aten_ops_per_step(eager_step), best_seconds(eager_step, device, repeats))
    start = time.perf_counter()
    try:
        code = _generated_code_of(compiled_step)
    except Exception as error:  # noqa: BLE001 - Inductor raises many types; report, don't crash
        err = f"{type(error).__name__}: {error}"[:600]
        return StepComparison(eager.eager_aten_ops, eager.eager_s, error=err)
    cold = time.perf_counter() - start
    return StepComparison(
        eager.eager_aten_ops,
        eager.eager_s,
        compiled_aten_ops=aten_ops_per_step(compiled_step),
        compiled_s=best_seconds(compiled_step, device, repeats),
        cold_start_s=cold,
        kernels=sum(len(_kernel_names(c)) for c in code),
        graphs=len(code),
    )
