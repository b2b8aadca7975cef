"""The same user function runs unchanged under torchrun and on a Cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dtlab
from dtlab.runtime.devices import loopback_interface
from dtlab.runtime.hang import describe_blocking_call

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    import dtlab

    def rank_sum(scale):
        t = torch.tensor([float(dtlab.rank())])
        with dtlab.trace.span("allreduce", kind="comm", nbytes=4):
            dist.all_reduce(t)
        return {"rank": dtlab.rank(), "world": dtlab.world_size(), "sum": t.item() * scale,
                "listen_on": os.environ.get("GLOO_SOCKET_IFNAME")}

    if __name__ == "__main__":
        out = dtlab.launch(rank_sum, 2.0, world_size=2)
        if dtlab.rank() == 0:
            print("RESULT", json.dumps({"values": list(out), "spans": len(out.trace)}))
    """
)


def _result_line(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_launch_under_torchrun_gathers_every_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = _result_line(done.stdout)
    # --standalone: one node, so gloo listens on loopback only, as in a Cluster.
    expected = {"world": 2, "sum": 2.0, "listen_on": loopback_interface()}
    assert result["values"] == [{"rank": r, **expected} for r in range(2)]
    assert result["spans"] == 2


def test_launch_without_torchrun_uses_a_local_cluster(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _result_line(done.stdout)["values"][1] == {
        "rank": 1, "world": 2, "sum": 2.0, "listen_on": loopback_interface()
    }  # fmt: skip


def test_launch_needs_world_size_outside_torchrun():
    import pytest

    with pytest.raises(ValueError, match="needs world_size"):
        dtlab.launch(lambda: None)


DUMP = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/x/dtlab/runtime/worker.py", line 40 in _watch_parent

Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2801 in broadcast
  File "/venv/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/tmp/ipykernel_1/123.py", line 4 in mismatched
  File "/x/dtlab/runtime/worker.py", line 70 in _call_user_function
  File "/x/dtlab/runtime/worker.py", line 96 in _run_one
"""


def test_stack_dump_names_the_collective_and_the_user_line():
    text = describe_blocking_call(DUMP)
    assert text == (
        "blocked in torch.distributed.broadcast, called from mismatched (/tmp/ipykernel_1/123.py:4)"
    )


def test_stack_dump_without_a_collective_names_the_user_frame():
    dump = DUMP.replace("distributed/distributed_c10d.py", "nn/modules/module.py")
    dump = dump.replace("distributed/c10d_logger.py", "nn/other.py")
    assert describe_blocking_call(dump).startswith("busy or blocked in mismatched")
    assert describe_blocking_call("") == "no Python stack could be read"


def test_stack_dump_names_our_collective_when_it_waits_on_a_message():
    dump = DUMP.replace(
        '  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2801 in broadcast\n'
        '  File "/venv/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper\n',
        '  File "/x/dtlab/collectives/ring_pipeline.py", line 174 in _run_streaming\n'
        '  File "/x/dtlab/collectives/allreduce.py", line 61 in all_reduce_ring_\n'
        '  File "/x/dtlab/collectives/allreduce.py", line 230 in all_reduce\n',
    )
    assert describe_blocking_call(dump) == (
        "blocked in dtlab.collectives.all_reduce (waiting in _run_streaming), "
        "called from mismatched (/tmp/ipykernel_1/123.py:4)"
    )


def test_launch_under_torchrun_joins_with_the_start_timeout_then_trains_with_the_short_one(
    tmp_path,
):
    """The start-up path runs end to end under torchrun (join with 300 s, barrier, shorten to
    7 s); that the shortened timeout really fires is held by
    tests/test_faults_timeouts.py::test_the_shortened_training_timeout_fires_before_a_silent_peer_wakes."""
    script = tmp_path / "train.py"
    script.write_text(
        SCRIPT.replace(
            "dtlab.launch(rank_sum, 2.0, world_size=2)",
            "dtlab.launch(rank_sum, 2.0, world_size=2, start_timeout=300, timeout=7)",
        )
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run([*cmd, str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [v["sum"] for v in _result_line(done.stdout)["values"]] == [2.0, 2.0]
