"""In-job recovery: data-parallel replicas keep stepping while one is replaced (torchft's idea).

Each rank is one *replica* of the whole model (a replica group of size one; in torchft each
group may itself be FSDP-sharded), kept on the host: the per-quorum groups are gloo groups built
from the shared store, whatever backend the Cluster itself uses. Every step:

1. the live replicas agree on the step's quorum (:mod:`dtlab.faults.quorum`);
2. if the membership changed, they build a fresh gloo process group over exactly the members
   (``ProcessGroupGloo`` on a ``PrefixStore`` of the shared store — torchft's reconfigurable
   communicator); otherwise they keep the last one;
3. a rejoining replica receives the model and optimizer state from the quorum's donor by
   point-to-point send (nobody else waits for it), bytes counted;
4. each member computes the gradient of its own rows of the global batch, and one all-reduce
   over the quorum averages gradients (and the loss) over the members present.

A crash is *simulated in the process*: at the chosen step the replica drops its model and
optimizer (a replacement starts from a fresh random model), stays silent for ``down_s`` seconds
(the replacement booting), then asks to rejoin. The process itself stays up because the
Cluster treats the death of a rank process as the end of the whole run (RankDied) — exactly
what in-job recovery avoids; everything the survivors see (a missing heartbeat, a smaller
quorum, a rejoin request, a state transfer) is real and happens between real processes.
While the replica is down, its rows of each global batch are skipped: those steps average over
fewer samples, so the final loss differs slightly from an unfailed run; no step is skipped.
"""

from __future__ import annotations

import io
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from dtlab.faults.quorum import Quorum, decide, request_rejoin
from dtlab.trace import span


@dataclass(frozen=True)
class ReplicaSpec:
    """Train the tiny lab GPT for ``steps`` steps on replicas; ``crash=(replica, step)``."""

    steps: int = 20
    batch_size: int = 6
    lr: float = 1e-2
    seed: int = 0
    heartbeat_s: float = 2.0
    start_timeout_s: float = 60.0
    down_s: float = 0.3
    crash: tuple[int, int] | None = None


def _fresh(spec: ReplicaSpec, seed: int):
    from dtlab.models import GPT, GPTConfig

    model = GPT(GPTConfig.tiny(), seed=seed)
    return model, torch.optim.AdamW(model.parameters(), lr=spec.lr)


def _state_bytes(model, opt) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _transfer(pg, quorum: Quorum, me: int, model, opt) -> int:
    """Donor → each rejoiner: size, then the serialized weights and optimizer state."""
    index = quorum.members.index
    moved = 0
    if me == quorum.donor:
        payload = _state_bytes(model, opt)
        for r in quorum.rejoiners:
            size = torch.tensor([payload.numel()], dtype=torch.long)
            pg.send([size], index(r), 0).wait()
            pg.send([payload], index(r), 1).wait()
            moved += payload.numel()
    elif me in quorum.rejoiners:
        size = torch.zeros(1, dtype=torch.long)
        pg.recv([size], index(quorum.donor), 0).wait()
        payload = torch.empty(int(size), dtype=torch.uint8)
        pg.recv([payload], index(quorum.donor), 1).wait()
        state = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        moved = payload.numel()
    return moved


def train_replicas(spec: ReplicaSpec) -> dict:
    """Run on every rank of a Cluster; returns this replica's per-step log and final weights."""
    from dtlab.models import SyntheticTokens, loss_fn, shard_for_rank

    me, n = dist.get_rank(), dist.get_world_size()
    token = [secrets.token_hex(4) if me == 0 else None]
    dist.broadcast_object_list(token, src=0)  # a fresh key space in the shared store
    store = dist.PrefixStore(f"ft/{token[0]}/", dist.distributed_c10d._get_default_store())
    model, opt = _fresh(spec, spec.seed)
    # batch ``steps`` is never trained on: the final weights' loss on it compares runs
    data = SyntheticTokens(model.config, spec.steps + 1, spec.batch_size, seed=spec.seed)
    losses, quorums, moved = {}, {}, 0
    pg, pg_members = None, None
    previous = tuple(range(n))
    step = 0
    while step < spec.steps:
        if spec.crash == (me, step):
            model, opt = _fresh(spec, seed=1000 + me)  # the replacement knows nothing
            with span("down: replacement starting", kind="idle", step=step):
                time.sleep(spec.down_s)
            with span("rejoin request", kind="idle"):
                quorum = request_rejoin(store, me)
            step, pg_members = quorum.step, None
        else:
            # The first quorum waits for everyone (the job starts whole); later ones presume a
            # replica dead after one missed heartbeat.
            patience = spec.start_timeout_s if step == 0 else spec.heartbeat_s
            with span("quorum", kind="idle", step=step):
                quorum = decide(store, step, me, previous, n, patience)
            if me not in quorum.members:  # too slow to count: rejoin like a replacement
                quorum = request_rejoin(store, me)
                step, pg_members = quorum.step, None
        if quorum.members != pg_members or quorum.rejoiners:
            pg_members = quorum.members
            prefixed = dist.PrefixStore(f"pg/{quorum.step}/", store)
            pg = dist.ProcessGroupGloo(
                prefixed, pg_members.index(me), len(pg_members), timedelta(seconds=60)
            )
        if quorum.rejoiners:
            with span("recovery: copy state from peer", kind="comm", step=step):
                moved += _transfer(pg, quorum, me, model, opt)
        x, y = shard_for_rank(data[step], me, n)
        with span("train_step", kind="compute", step=step, quorum=len(quorum.members)):
            loss = loss_fn(model(x), y)
            loss.backward()
            params = [p for p in model.parameters()]
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
        with span("allreduce", kind="comm", nbytes=flat.numel() * 4, step=step):
            pg.allreduce([flat]).wait()
        flat /= len(quorum.members)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = float(flat[-1])
        quorums[step] = list(quorum.members)
        previous = quorum.members
        step += 1
    dist.barrier()
    with torch.no_grad():
        held_out = float(loss_fn(model(data[spec.steps][0]), data[spec.steps][1]))
    return {
        "held_out_loss": held_out,
        "losses": losses,
        "quorums": quorums,
        "state_bytes_received_or_sent": moved,
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }
