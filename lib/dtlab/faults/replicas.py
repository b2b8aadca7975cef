"""In-job recovery: data-parallel replicas keep stepping while one is replaced (torchft's idea).

Each rank is one *replica* of the whole model (a replica group of size one; in torchft each
group may itself be FSDP-sharded), kept on the host: the per-quorum groups are gloo groups built
on the job's own ``TCPStore`` (hosted by Cluster rank 0 on a free loopback port, the part torchft's
lighthouse plays), whatever backend the Cluster itself uses. Every step:

1. the live replicas agree on the step's quorum (:mod:`dtlab.faults.quorum`);
2. if the membership changed, they build a fresh gloo process group over exactly the members
   (``ProcessGroupGloo`` on a ``PrefixStore`` of that store — torchft's reconfigurable
   communicator); otherwise they keep the last one;
3. a rejoining replica receives the model and optimizer state from the quorum's donor by
   point-to-point send (nobody else waits for it), bytes counted;
4. each member computes the gradient of its own rows of the global batch, and one all-reduce
   over the quorum averages gradients (and the loss) over the members present;
5. the members vote (:func:`~dtlab.faults.quorum.should_commit`): only if every member's
   all-reduce succeeded is the averaged gradient applied (``opt.step``). Otherwise the attempt
   is discarded — gradients zeroed, weights and optimizer untouched — and the *same* step is
   redone with a new quorum (torchft's error → ``should_commit() == False`` → retry).

A crash is a real process death: each replica runs in its own OS process, forked by its Cluster
rank, which plays the replica's launcher (:mod:`dtlab.faults.replica_process`). At the chosen step
the replica sends itself ``SIGKILL`` — its model, optimizer state and sockets are gone. The
survivors notice only what a real job notices: its heartbeat (``join/<step>``) does not come, so
the next quorum leaves it out and they keep stepping. Its launcher sees the process die, waits
``down_s`` (the replacement booting) and forks a replacement that starts from a *different*
random model, asks to rejoin and receives weights and optimizer state from a healthy peer.
With ``crash=(r, step, "allreduce")`` the replica dies *during* the step: its gradient
all-reduce (two buckets) is half done — it took part in the first bucket and is killed before
sending the second. Its sockets close, the survivors' gloo collective raises ("Connection
closed by peer"; ``collective_timeout_s`` bounds a hang), they vote to abort, and redo the step without it: the broken step's partial sums never reach
the weights, and every survivor still commits every step exactly once.
While the replica is down, its rows of each global batch are skipped: those steps average over
fewer samples, so the final loss differs slightly from an unfailed run; no step is skipped.
"""

from __future__ import annotations

import io
import os
import secrets
import signal
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from dtlab.faults.quorum import (
    Quorum,
    announce_replacement,
    decide,
    request_rejoin,
    should_commit,
)
from dtlab.faults.replica_process import report
from dtlab.trace import span


@dataclass(frozen=True)
class ReplicaSpec:
    """Train the tiny lab GPT for ``steps`` steps on replicas.

    ``crash=(replica, step)`` sends that replica's process ``SIGKILL`` at the start of that step;
    ``crash=(replica, step, "allreduce")`` kills it with its gradient all-reduce in flight.
    ``heartbeat_s``: how long a quorum (or a commit vote) waits for a member before presuming it
    dead; ``collective_timeout_s``: gloo's timeout, which bounds a hung collective; ``down_s``:
    how long a replacement takes to start; ``join_timeout_s``: how long a quorum waits for an
    announced replacement. ``apply_broken_allreduce``: a deliberately wrong replica for the
    negative check — it skips the commit vote and applies whatever a failed all-reduce left.
    """

    steps: int = 20
    batch_size: int = 6
    lr: float = 1e-2
    seed: int = 0
    heartbeat_s: float = 2.0
    start_timeout_s: float = 60.0
    down_s: float = 0.3
    join_timeout_s: float = 30.0
    crash: tuple[int, int] | tuple[int, int, str] | None = None
    collective_timeout_s: float = 10.0
    apply_broken_allreduce: bool = False

    def __post_init__(self):
        if self.crash is not None and self.crash[2:] not in ((), ("start",), ("allreduce",)):
            raise ValueError(f"crash phase {self.crash[2]!r}: use 'start' or 'allreduce'")


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


def _crash_point(spec: ReplicaSpec, me: int, incarnation: int) -> tuple[int, str] | None:
    """(step, phase) at which this process kills itself, or ``None``."""
    if spec.crash is None or incarnation > 0 or spec.crash[0] != me:
        return None
    return spec.crash[1], (spec.crash[2] if len(spec.crash) > 2 else "start")


def _allreduce(pg, flat: torch.Tensor, labels: dict, die: bool) -> str | None:
    """Sum ``flat`` over the quorum in place, in two buckets posted asynchronously (as DDP
    buckets gradients); ``None`` on success, else the collective's error.

    ``die``: this replica takes part in the first bucket and is killed (``SIGKILL``) before it
    sends the second: the members' gradient all-reduce breaks half done, whatever the timing.
    (Killing it right after posting a single all-reduce can lose the race: on loopback the
    collective sometimes completes first.)"""
    buckets = flat.chunk(2)  # views: each bucket's all-reduce writes into ``flat``
    with span("allreduce", kind="comm", nbytes=flat.numel() * 4, **labels):
        if die:
            pg.allreduce([buckets[0]]).wait()
            os.kill(os.getpid(), signal.SIGKILL)  # bucket 2 never leaves this process
        works = [pg.allreduce([bucket]) for bucket in buckets]
        try:
            for work in works:
                work.wait()
        except RuntimeError as error:  # gloo: "Connection closed by peer", or its timeout
            return str(error).splitlines()[0]
    return None


def _replica(spec: ReplicaSpec, me: int, n: int, port: int, token: str, incarnation: int) -> dict:
    """One replica process: train until ``spec.steps``; incarnation > 0 is a replacement."""
    from dtlab.models import SyntheticTokens, loss_fn, shard_for_rank

    client = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=spec.start_timeout_s)
    )
    store = dist.PrefixStore(f"ft/{token}/", client)
    model, opt = _fresh(spec, spec.seed if incarnation == 0 else 1000 * incarnation + me)
    # batch ``steps`` is never trained on: the final weights' loss on it compares runs
    data = SyntheticTokens(model.config, spec.steps + 1, spec.batch_size, seed=spec.seed)
    losses, quorums, aborted, committed, moved = {}, {}, [], [], 0
    pg, pg_members = None, None
    previous = tuple(range(n))
    step, attempt, admitted = 0, 0, None
    crash = _crash_point(spec, me, incarnation)
    if incarnation > 0:  # a replacement: admitted by some step's quorum, as a rejoiner
        report("rejoin request")
        with span("rejoin request", kind="idle"):
            admitted = request_rejoin(store, me)
        step, attempt = admitted.step, admitted.attempt
    while step < spec.steps:
        if crash == (step, "start"):
            report("start", step=step, attempt=attempt)
            os.kill(os.getpid(), signal.SIGKILL)  # the replica process dies here, for real
        at = {"step": step, "attempt": attempt}
        if admitted is not None:
            quorum, admitted = admitted, None
        else:
            # The first quorum waits for everyone (the job starts whole); later ones presume a
            # replica dead after one missed heartbeat.
            patience = spec.start_timeout_s if step == attempt == 0 else spec.heartbeat_s
            report("quorum", **at)
            with span("quorum", kind="idle", **at):
                quorum = decide(
                    store, step, me, previous, n, patience, spec.join_timeout_s, attempt
                )
            if me not in quorum.members:  # too slow to count: rejoin like a replacement
                quorum = request_rejoin(store, me)
                step, attempt, pg_members = quorum.step, quorum.attempt, None
                at = {"step": step, "attempt": attempt}
        if quorum.members != pg_members or quorum.rejoiners:
            pg_members = quorum.members
            prefixed = dist.PrefixStore(f"pg/{quorum.step}/{quorum.attempt}/", store)
            timeout = timedelta(seconds=spec.collective_timeout_s)  # bounds a hung collective
            pg = dist.ProcessGroupGloo(prefixed, pg_members.index(me), len(pg_members), timeout)
        if quorum.rejoiners:
            with span("recovery: copy state from peer", kind="comm", **at):
                moved += _transfer(pg, quorum, me, model, opt)
        x, y = shard_for_rank(data[step], me, n)
        report("train_step", **at)
        with span("train_step", kind="compute", quorum=len(quorum.members), **at):
            loss = loss_fn(model(x), y)
            loss.backward()
            params = [p for p in model.parameters()]
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
        report("allreduce", **at)
        error = _allreduce(pg, flat, at, die=crash == (step, "allreduce"))
        if error is not None:  # drop the broken communicator now: its sockets close, so a
            pg = pg_members = None  # member still blocked in it (on us, not the dead) fails too
        if spec.apply_broken_allreduce:
            commit = True  # the deliberate bug: no vote, whatever the buffer holds is applied
        else:
            report("should_commit", **at)
            with span("should_commit", kind="idle", **at):
                commit = should_commit(store, quorum, me, error is None, spec.heartbeat_s)
        if not commit:  # torchft: the step is not committed; redo it with a new quorum
            opt.zero_grad(set_to_none=True)  # nothing of this attempt reaches the weights
            aborted.append({**at, "members": list(quorum.members), "error": error})
            previous, attempt = quorum.members, attempt + 1
            pg = pg_members = None  # the next attempt gets a fresh communicator
            continue
        flat /= len(quorum.members)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[step] = float(flat[-1])
        committed.append(step)  # a list: a step committed twice would show
        quorums[step] = list(quorum.members)
        previous = quorum.members
        step, attempt = step + 1, 0
    with torch.no_grad():
        held_out = float(loss_fn(model(data[spec.steps][0]), data[spec.steps][1]))
    return {
        "held_out_loss": held_out,
        "losses": losses,
        "quorums": quorums,
        "aborted": aborted,
        "committed": committed,
        "state_bytes_received_or_sent": moved,
        "pid": os.getpid(),
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def _warm_up(spec: ReplicaSpec) -> None:
    """Import and initialise the model and AdamW machinery once in the launcher, so a forked
    replica starts in milliseconds (the boot time of a replacement is ``down_s``, on purpose)."""
    from dtlab.models import SyntheticTokens, loss_fn

    model, opt = _fresh(spec, spec.seed)
    x, y = SyntheticTokens(model.config, 1, 1, seed=spec.seed)[0]
    loss_fn(model(x), y).backward()
    opt.step()


def train_replicas(spec: ReplicaSpec) -> dict:
    """Run on every rank of a Cluster (each rank: one replica's launcher); returns this
    replica's per-step log, final weights, and the deaths of its processes."""
    from dtlab.faults.replica_process import supervise_replica

    me, n = dist.get_rank(), dist.get_world_size()
    server, info = None, [None]
    if me == 0:  # the job's store (torchft's lighthouse plays this part), on a free port
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        info[0] = (server.port, secrets.token_hex(4))
    dist.broadcast_object_list(info, src=0)
    port, token = info[0]
    launcher = dist.PrefixStore(f"ft/{token}/", dist.TCPStore("127.0.0.1", port, is_master=False))
    _warm_up(spec)

    def incarnation(k: int):
        return lambda: _replica(spec, me, n, port, token, k)

    out = supervise_replica(
        incarnation, me, spec.down_s, 2, lambda: announce_replacement(launcher, me)
    )
    dist.barrier()  # rank 0 keeps the store up until every replica is done
    del server
    return out
