"""The roofline of the machine this runs on, measured, and where an op sits on it.

Williams, Waterman & Patterson (2009), "Roofline: an insightful visual performance model": an op
that does ``F`` FLOPs and moves ``Q`` bytes between memory and the chip has **arithmetic
intensity** ``I = F / Q`` (FLOP per byte). The chip cannot run it faster than

    attainable(I) = min(peak FLOP/s, I × bandwidth)

so below the **ridge point** ``I* = peak / bandwidth`` the op is **memory-bound** (its time is
``Q / bandwidth``), above it **compute-bound** (``F / peak``).

Both roofs are *measured* here, never read off a datasheet:

* the compute roof is the best FLOP/s of a square-GEMM sweep (``2·n³`` FLOPs per ``n × n``
  product, timed on the clock, the best of several repeats — a peak is a best case);
* the memory roof is a streaming copy ``dst.copy_(src)`` of a buffer far larger than the caches,
  moving ``2 × nbytes`` (read ``src``, write ``dst``) per copy.

On a GPU :data:`DATASHEETS` holds the vendor's dense BF16 peak and HBM bandwidth to print
*beside* the measured roofs (a sweep in FP32/TF32 or BF16 reaches a fraction of them).

:func:`op_cost` is the formula side: FLOPs and bytes of a matmul or an elementwise op from its
shapes, which :mod:`dtlab.perf.op_census` checks against what the dispatcher counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dtlab.cost.hardware import GPUS

#: Vendor figures printed beside a measured roofline on a GPU (dense BF16, HBM), by name match.
DATASHEETS = {"H100": GPUS["h100_sxm"], "H200": GPUS["h200_sxm"], "A100": GPUS["a100_80gb"]}


@dataclass(frozen=True)
class Roofline:
    """Two measured roofs: ``peak_flops`` (FLOP/s) and ``bandwidth`` (bytes/s) of one device."""

    device: str
    peak_flops: float
    bandwidth: float
    gemm_points: tuple[tuple[int, float], ...] = ()  # (n, FLOP/s) of the sweep
    copy_bytes: int = 0

    @property
    def ridge(self) -> float:
        """FLOP per byte where the two roofs meet: ``peak_flops / bandwidth``."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """``min(peak, intensity × bandwidth)`` FLOP/s."""
        return min(self.peak_flops, intensity * self.bandwidth)

    def bound(self, intensity: float) -> str:
        """``"memory"`` below the ridge point, ``"compute"`` at or above it."""
        return "memory" if intensity < self.ridge else "compute"

    def predicted_seconds(self, flops: float, nbytes: float) -> float:
        """The roofline's lower bound on an op's time: ``max(F / peak, Q / bandwidth)``."""
        return max(flops / self.peak_flops, nbytes / self.bandwidth)


def datasheet_for(device_name: str):
    """The :class:`~dtlab.cost.hardware.GPUSpec` whose name appears in ``device_name``, or None.

    The sheets are the SXM parts'. A PCIe or NVL card of the same name has less compute and
    bandwidth (H100 PCIe: 756 TFLOP/s BF16 dense, 2.0 TB/s), so none is printed for it rather
    than the wrong one."""
    name = device_name.upper()
    if "PCIE" in name or "NVL" in name:
        return None
    for key, spec in DATASHEETS.items():
        if key in name:
            return spec
    return None


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def best_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed calls (after one warm-up), with the device drained."""
    sync = _sync(device)
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_sweep(
    sizes: tuple[int, ...],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
) -> list[tuple[int, float]]:
    """Measured FLOP/s of an ``n × n`` by ``n × n`` matmul for each ``n``: ``2n³ / best time``."""
    points = []
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        seconds = best_seconds(lambda a=a, b=b, out=out: torch.mm(a, b, out=out), device, repeats)
        points.append((n, 2 * n**3 / seconds))
    return points


def copy_bandwidth(nbytes: int, device: torch.device, repeats: int = 5) -> float:
    """Measured bytes/s of a streaming copy: ``2 × nbytes`` (read + write) / best time."""
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / best_seconds(lambda: dst.copy_(src), device, repeats)


def measure_roofline(
    device: torch.device | str = "cpu",
    sizes: tuple[int, ...] | None = None,
    copy_bytes: int | None = None,
    dtype: torch.dtype | None = None,
    fast: bool = False,
) -> Roofline:
    """Measure both roofs on ``device``. Defaults suit the device: on a CPU an FP32 sweep up to
    ``n = 1024`` (512 when ``fast``) and a 256 MiB copy (64 MiB), best of 5 timed repeats (3); on a GPU a BF16 sweep up to
    ``n = 8192`` (the datasheet's precision) and a 2 GiB copy. ``copy_bytes`` must dwarf the
    last-level cache or the copy measures the cache."""
    device = torch.device(device)
    gpu = device.type == "cuda"
    if sizes is None:
        sizes = (1024, 2048, 4096, 8192) if gpu else (64, 128, 256, 512) + (() if fast else (1024,))
    if copy_bytes is None:
        copy_bytes = (2 << 30) if gpu else ((64 << 20) if fast else (256 << 20))
    dtype = dtype or (torch.bfloat16 if gpu else torch.float32)
    repeats = 3 if fast else 5
    points = gemm_sweep(sizes, device, dtype, repeats)
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    return Roofline(
        name,
        max(f for _, f in points),
        copy_bandwidth(copy_bytes, device, repeats),
        tuple(points),
        copy_bytes,
    )


def op_cost(op: str, dims: dict, bytes_per_element: int) -> tuple[float, float]:
    """``(FLOPs, bytes)`` of one op from its shapes, each tensor read or written once.

    * ``matmul`` ``{m, k, n}``: ``2mkn`` FLOPs; reads ``mk + kn``, writes ``mn`` elements;
    * ``add`` / ``mul`` ``{n}``: ``n`` FLOPs; reads ``2n``, writes ``n``;
    * ``gelu`` / ``relu`` ``{n}``: ``n`` FLOPs (one per element, the convention for pointwise
      ops; the tensor cores do none of them); reads ``n``, writes ``n``;
    * ``bias_gelu`` ``{rows, cols}`` fused: ``2·rows·cols`` FLOPs; reads the input and the bias,
      writes the output once.
    """
    e = bytes_per_element
    if op == "matmul":
        m, k, n = dims["m"], dims["k"], dims["n"]
        return 2.0 * m * k * n, float((m * k + k * n + m * n) * e)
    if op in ("add", "mul"):
        return float(dims["n"]), float(3 * dims["n"] * e)
    if op in ("gelu", "relu"):
        return float(dims["n"]), float(2 * dims["n"] * e)
    if op == "bias_gelu":
        r, c = dims["rows"], dims["cols"]
        return 2.0 * r * c, float((2 * r * c + c) * e)
    raise ValueError(
        f"no cost formula for op {op!r}; choose matmul, add, mul, gelu, relu, bias_gelu"
    )


def intensity_and_bound(
    op: str, dims: dict, bytes_per_element: int, peak_flops: float, bandwidth: float
) -> tuple[float, str]:
    """Arithmetic intensity (FLOP/byte) of :func:`op_cost` and ``"memory"``/``"compute"``."""
    flops, nbytes = op_cost(op, dims, bytes_per_element)
    intensity = flops / nbytes
    return intensity, Roofline("given", peak_flops, bandwidth).bound(intensity)
