"""A killed notebook kernel takes its ranks with it, even ranks blocked in a collective."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from dtlab.runtime.pool import pid_alive

KERNEL = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    import dtlab

    cluster = dtlab.Cluster(3, device="cpu", timeout=600)
    print(" ".join(map(str, cluster.pids)), flush=True)

    def stuck():
        if dtlab.rank() != 0:
            dist.broadcast(torch.ones(1), src=0)   # rank 0 never joins: ranks 1, 2 block in C++
        time.sleep(600)

    cluster.run(stuck)
    """
)


def test_ranks_exit_when_the_kernel_is_killed(tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    kernel = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)
        time.sleep(1.0)  # let the ranks enter the blocking broadcast
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in pids if pid_alive(p)] == []
    finally:
        if kernel.poll() is None:
            kernel.kill()
