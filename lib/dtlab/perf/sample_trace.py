"""A GPU step's profiler trace with planted host syncs, for reading practice and grading.

There is no GPU on a workshop laptop, so the lab's "read this profile" exercises use a trace
*generated* here, shaped like ``torch.profiler``'s Chrome export of a CUDA step: ``cpu_op``
events (``aten::…``), the ``cuda_runtime`` calls they make (``cudaLaunchKernel``,
``cudaMemcpyAsync``, ``cudaStreamSynchronize`` …) and the ``kernel`` events on the GPU, all with
``ts``/``dur`` in microseconds. The timing obeys the queue: a kernel starts when it was launched
and the previous kernel finished; a blocking call ends when the queue has drained. It is a
model, labelled as such wherever it is shown — the GPU suite records real ones.

Planted syncs (each a ``cpu_op`` whose runtime calls block): ``aten::item`` (a loss read),
``aten::nonzero``, ``aten::_to_copy`` device→pageable host (``.tolist()`` / ``print``), and an
explicit ``torch.cuda.synchronize``. Decoys that do **not** block the host: a non-blocking
device→pinned copy, ``cudaStreamWaitEvent`` (the device waits, not the host), ``cudaEventRecord``
and host→device copies.
"""

from __future__ import annotations

import random

_COMPUTE = ["aten::mm", "aten::addmm", "aten::gelu", "aten::add", "aten::native_layer_norm",
            "aten::_softmax", "aten::bmm", "aten::mul"]  # fmt: skip
_SYNCS = ["aten::item", "aten::nonzero", "aten::_to_copy", "torch.cuda.synchronize"]
_DECOYS = ["aten::copy_ (pinned, non_blocking)", "record_stream_wait", "aten::copy_ (HtoD)"]


class _Step:
    def __init__(self, seed: int, kernel_us: tuple[float, float]) -> None:
        self.rng = random.Random(seed)
        self.kernel_us = kernel_us
        self.events: list[dict] = []
        self.host = 0.0  # µs: where the CPU thread is
        self.gpu_free = 0.0  # µs: when the GPU finishes its queue

    def runtime(self, name: str, dur: float, **args) -> dict:
        event = {"name": name, "cat": "cuda_runtime", "ts": self.host, "dur": dur, "args": args}
        self.events.append(event)
        self.host += dur
        return event

    def kernel(self, name: str, dur: float) -> None:
        start = max(self.host, self.gpu_free)
        self.events.append({"name": name, "cat": "kernel", "ts": start, "dur": dur, "args": {}})
        self.gpu_free = start + dur

    def launch(self, name: str) -> None:
        self.runtime("cudaLaunchKernel", self.rng.uniform(4, 8))
        self.kernel(name, self.rng.uniform(*self.kernel_us))

    def wait_for_queue(self, name: str, **args) -> None:
        """A blocking runtime call: returns when the GPU's queue is empty."""
        start = self.host
        end = max(self.gpu_free, start + 2.0) + 3.0
        self.events.append(
            {"name": name, "cat": "cuda_runtime", "ts": start, "dur": end - start, "args": args}
        )
        self.host = end

    def op(self, name: str) -> dict:
        event = {"name": name, "cat": "cpu_op", "ts": self.host, "dur": 0.0, "args": {}}
        self.events.append(event)
        self.host += 2.0
        if name in _COMPUTE:
            self.launch(name.removeprefix("aten::") + "_kernel")
        elif name == "aten::item":
            self.runtime("cudaMemcpyAsync", 3.0, kind="DtoH (Device -> Pageable)")
            self.kernel("Memcpy DtoH (Device -> Pageable)", 2.0)
            self.wait_for_queue("cudaStreamSynchronize")
        elif name == "aten::nonzero":
            self.launch("nonzero_count_kernel")
            self.runtime("cudaMemcpyAsync", 3.0, kind="DtoH (Device -> Pageable)")
            self.kernel("Memcpy DtoH (Device -> Pageable)", 2.0)
            self.wait_for_queue("cudaStreamSynchronize")
            self.launch("nonzero_write_kernel")
        elif name == "aten::_to_copy":
            self.runtime("cudaMemcpyAsync", 3.0, kind="DtoH (Device -> Pageable)")
            self.kernel("Memcpy DtoH (Device -> Pageable)", 6.0)
            self.wait_for_queue("cudaStreamSynchronize")
        elif name == "torch.cuda.synchronize":
            self.wait_for_queue("cudaDeviceSynchronize")
        elif name == "aten::copy_ (pinned, non_blocking)":
            self.runtime("cudaMemcpyAsync", 4.0, kind="DtoH (Device -> Pinned)")
            self.kernel("Memcpy DtoH (Device -> Pinned)", 6.0)
        elif name == "record_stream_wait":
            self.runtime("cudaEventRecord", 2.0)
            self.runtime("cudaStreamWaitEvent", 2.0)
        elif name == "aten::copy_ (HtoD)":
            self.runtime("cudaMemcpyAsync", 4.0, kind="HtoD (Pinned -> Device)")
            self.kernel("Memcpy HtoD (Pinned -> Device)", 6.0)
        self.host += 1.0
        event["dur"] = self.host - event["ts"]
        return event


def planted_profile(
    seed: int = 0, n_ops: int = 40, n_syncs: int = 4, kernel_us: tuple[float, float] = (40, 400)
) -> tuple[list[dict], list[int]]:
    """``(events, sync_indices)``: a step of ``n_ops`` ops with ``n_syncs`` planted host syncs
    and three decoys; ``sync_indices`` are the planted ``cpu_op`` events' positions, in the
    order the events were recorded. Kernels last ``kernel_us`` (uniform): the default keeps the
    GPU ahead of the host; a few µs makes the step launch-bound."""
    step = _Step(seed, kernel_us)
    kinds = [step.rng.choice(_COMPUTE) for _ in range(n_ops)]
    syncs = [_SYNCS[i % len(_SYNCS)] for i in range(n_syncs)]
    slots = sorted(step.rng.sample(range(3, n_ops), n_syncs + len(_DECOYS)))
    for slot, name in zip(slots, [*syncs, *_DECOYS], strict=True):
        kinds[slot] = name
    planted = []
    for name in kinds:
        event = step.op(name)
        if name in _SYNCS:
            planted.append(step.events.index(event))
    return step.events, planted


def summarise(events: list[dict]) -> dict[str, float]:
    """What a reader takes from a trace first: kernels, their mean time, the device's busy share,
    and the host's mean time per op."""
    kernels = [e for e in events if e["cat"] == "kernel"]
    ops = [e for e in events if e["cat"] == "cpu_op"]
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    busy = sum(e["dur"] for e in kernels)
    return {
        "kernels": len(kernels),
        "mean_kernel_us": busy / len(kernels),
        "step_us": end - start,
        "device_busy_share": busy / (end - start),
        "mean_host_us_per_op": sum(e["dur"] for e in ops) / len(ops),
    }


def gpu_idle_us(events: list[dict]) -> float:
    """Microseconds the GPU sat idle between its first and last kernel: the bubbles syncs make."""
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel")
    return sum(max(0.0, b[0] - a[1]) for a, b in zip(kernels, kernels[1:], strict=False))
