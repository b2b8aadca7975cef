"""The composed training script runs under two torchrun agents on one machine, as on two nodes.

Two ``torchrun --nnodes=2 --nproc-per-node=2`` agents meet at a c10d rendezvous on a free
loopback port (each agent is a "node" of 2 ranks). The script builds a ``Mesh(dp=2, tp=2)`` and
an HSDP mesh ``Mesh(dp=4)`` from torchrun's environment: the mesh reads ``LOCAL_WORLD_SIZE``
to know which ranks share a node, so the TP groups stay inside a node, the DP groups cross
nodes, and HSDP shards inside each node and replicates across the two. Both train the tiny GPT
for two steps to the loss of one process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

from dtlab.runtime.devices import loopback_interface

SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    import dtlab

    def train(degrees, data_parallel):
        from dtlab.mesh import Mesh
        from dtlab.models import GPT, GPTConfig, SyntheticTokens, loss_fn
        from dtlab.parallel.compose import compose_gpt

        config = GPTConfig.tiny(seq_len=16, d_model=32, vocab_size=64, dropout=0.0)
        data = SyntheticTokens(config, n_batches=2, batch_size=4, seed=3)
        reference = GPT(config, seed=0, dtype=torch.float64)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        mesh = Mesh(**degrees)
        composed = compose_gpt(GPT(config, seed=0, dtype=torch.float64), mesh,
                               data_parallel=data_parallel)
        opt = torch.optim.SGD(composed.parameters(), lr=0.1)
        gaps = []
        for tokens, targets in data:
            ref_opt.zero_grad()
            ref_loss = loss_fn(reference(tokens), targets)
            ref_loss.backward()
            ref_opt.step()
            opt.zero_grad()
            gaps.append(abs(composed.train_step(tokens, targets) - ref_loss.item()))
            opt.step()
        crosses = {d: mesh.crosses_nodes(d) for d in ("dp", "tp")}
        return {"gap": max(gaps), "node": mesh.node_of(dtlab.rank()), "crosses": crosses,
                "hsdp_shard": composed.hsdp_shard}

    if __name__ == "__main__":
        import faulthandler, sys
        two_d = dtlab.launch(train, {"dp": 2, "tp": 2}, "ddp", world_size=4)
        hsdp = dtlab.launch(train, {"dp": 4}, "hsdp", world_size=4)
        if dtlab.rank() == 0:
            print("RESULT", json.dumps({"two_d": list(two_d), "hsdp": list(hsdp)}))
        # Still alive 60 s after the work: print every thread's stack (teardown hang evidence).
        faulthandler.dump_traceback_later(60, exit=False, file=sys.stderr)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_composed_training_under_two_torchrun_agents_as_two_nodes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = _free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": loopback_interface()}
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=2",
                f"--node-rank={node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id=dtlab-{port}",
                str(script),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for node in (0, 1)
    ]
    try:
        outputs = [agent.communicate(timeout=240) for agent in agents]
    except subprocess.TimeoutExpired:
        for agent in agents:
            agent.kill()
        tails = [(agent.communicate()[1] or "")[-4000:] for agent in agents]
        raise AssertionError(
            "a torchrun agent did not exit in 240 s; its stderr (worker stacks are dumped 60 s "
            "after the work ends):\n" + "\n---\n".join(tails)
        ) from None
    finally:
        for agent in agents:
            agent.kill()
    for agent, (_, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, err[-3000:]
    line = next(ln for out, _ in outputs for ln in out.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    for rank, r in enumerate(result["two_d"]):
        assert r["gap"] < 1e-10 and r["node"] == rank // 2
        assert r["crosses"] == {"dp": True, "tp": False}  # tp inside a node, dp across
    for r in result["hsdp"]:
        assert r["gap"] < 1e-10 and r["hsdp_shard"] == 2  # shard inside the node
