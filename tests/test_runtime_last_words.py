"""A rank that dies leaves its reason: RankDied carries the signal and what it last wrote to
stderr (C++ and Python alike, and Python's fatal-error stack), never an earlier run's output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import dtlab
from dtlab import Cluster, RankDied


def _abort_on_rank_1_after_saying_why():
    if dtlab.rank() == 1:
        print("python says: the sizes disagree (4 vs 3)", file=sys.stderr, flush=True)
        os.write(2, b"terminate called without an active exception\n")  # as C++ writes it
        os.abort()
    return "rank 0 done"


def test_rank_died_names_the_signal_and_quotes_the_ranks_last_stderr_lines():
    with Cluster(2, device="cpu", timeout=60) as cluster:
        cluster.run(lambda: print("an earlier run's warning", file=sys.stderr, flush=True))
        with pytest.raises(RankDied) as info:
            cluster.run(_abort_on_rank_1_after_saying_why)
        died = info.value
        assert died.rank == 1 and died.exitcode == -signal.SIGABRT
        text = str(died)
        assert "killed by SIGABRT" in text
        assert "the sizes disagree (4 vs 3)" in text
        assert "terminate called without an active exception" in text
        # faulthandler's fatal-error stack names the function the rank died in
        assert "_abort_on_rank_1_after_saying_why" in died.last_words
        assert "an earlier run's warning" not in text
        assert cluster.run(dtlab.rank) == [0, 1]  # fresh ranks


def test_a_sigkilled_rank_says_it_wrote_nothing_not_an_earlier_runs_output():
    with Cluster(2, device="cpu", timeout=60) as cluster:
        cluster.run(lambda: print("warning from a previous cell", file=sys.stderr, flush=True))
        with pytest.raises(RankDied) as info:
            cluster.run(lambda: os.kill(os.getpid(), signal.SIGKILL) if dtlab.rank() == 0 else 0)
        assert "SIGKILL" in str(info.value)
        assert info.value.last_words == ""
        assert "wrote nothing to stderr during the run" in str(info.value)
        assert "previous cell" not in str(info.value)


def test_captured_stderr_still_reaches_the_console_and_survives_the_process(tmp_path):
    path = tmp_path / "stderr.rank0"
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from dtlab.runtime.last_words import capture_stderr
        capture_stderr({str(path)!r})
        print("to the console and the file", file=sys.stderr, flush=True)
        time.sleep(1.0)  # the console copy looks every 0.2 s
        os.write(2, b"last line before abort\\n")
        os.abort()
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGABRT
    assert b"to the console and the file" in proc.stderr
    kept = path.read_text()
    assert "to the console and the file" in kept and "last line before abort" in kept
    assert "Fatal Python error: Aborted" in kept
