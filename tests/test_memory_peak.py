"""The CPU peak of a piece of work, read from the profiler's allocation events, is exact."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from dtlab.memory import peak_bytes_of
from dtlab.memory.peak import without_profiler_log_lines

MB4 = 1000 * 1000 * 4  # one 1000×1000 fp32 matrix


def test_peak_counts_tensors_alive_together_and_ignores_older_ones():
    x = torch.randn(1000, 1000)  # allocated before the work: not part of its peak

    def work():
        a = x @ x  # +4 MB
        b = a.relu()  # +4 MB: a and b alive together -> 8 MB peak
        del a  # -4 MB
        c = b.neg()  # +4 MB: back to 8 MB, not 12 (no Python scalars: each is a tiny tensor)
        return c

    result = peak_bytes_of(work)
    assert result.peak_bytes == 2 * MB4
    assert result.source == "cpu profiler"


def test_work_that_frees_everything_ends_at_zero():
    def work():
        t = torch.ones(256, 256)
        u = t.neg()
        del t, u

    result = peak_bytes_of(work)
    assert result.peak_bytes == 2 * 256 * 256 * 4
    assert result.end_bytes == 0


def test_the_profilers_log_lines_never_reach_stderr_but_the_works_own_output_does():
    # A fresh process with Kineto's and c10's default log levels: the ones a lab's rank has.
    script = (
        "import os, torch\n"
        "from dtlab.memory import peak_bytes_of\n"
        "held = [torch.ones(4096) for _ in range(3)]\n"
        "peak_bytes_of(lambda: (held.pop(), os.write(2, b'the work speaks\\n')))\n"
        "peak_bytes_of(lambda: held.pop())  # frees tensors made before the profiler started\n"
        "peak_bytes_of(lambda: torch.ones(64) + 1)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL")
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, timeout=300, check=True
    )
    assert b"profiler_start" not in done.stderr and b"USDT" not in done.stderr, done.stderr
    assert b"Memory block of unknown size" not in done.stderr, done.stderr
    assert done.stderr.count(b"the work speaks") == 1


def test_only_the_profilers_expected_lines_are_dropped_from_what_it_wrote():
    usdt = (
        b"USDT:2026-11-27 03:11:22 23313:23313 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    )
    unknown = (
        b"[rank0]:[W1127 03:28:19.297572422 CPUAllocator.cpp:245] Memory block of unknown size "
        b"was allocated before the profiling started, profiler results will not include the "
        b"deallocation event\n"
    )
    error = b"ERROR:2026-11-27 03:11:22 23313:23313 CuptiActivityApi.cpp:9] CUPTI failed\n"
    assert without_profiler_log_lines(usdt + b"gloo: connection lost\n" + unknown + error) == (
        b"gloo: connection lost\n" + error
    )
