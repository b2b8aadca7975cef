"""Every tensor handed to a collective or a message lives on the device of the data it goes with.

NCCL moves CUDA tensors only: a buffer made by ``torch.empty(n)`` (no ``device=``) beside CUDA
data fails there and nowhere else, so the CPU suite on gloo never sees it. These tests run on the
CPU and still catch it: the data lives on the ``meta`` device (shapes, no storage), a stand-in
communicator records the device of every tensor it is handed, and a buffer that the library made
on the CPU shows up as ``cpu`` beside ``meta``. Paths without data to take a device from use the
rank's device (:func:`dtlab.runtime.context.device`, patched to ``meta`` here). The refusals of a
receive from any source on NCCL are checked with the backend's name patched.
``tests/test_gpu_device_placement.py`` runs the same paths on a real NCCL rank.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from dtlab.runtime import context

META = torch.device("meta")


class _Stop(Exception):
    """Raised by the recorder where the real communicator would start moving bytes."""


class _Recorder:
    """A stand-in :class:`~dtlab.comm.Communicator` that records devices and moves nothing."""

    def __init__(self, world_size: int = 2, rank: int = 0, stop: bool = True) -> None:
        self.world_size, self.rank, self.stop = world_size, rank, stop
        self.devices: list[torch.device] = []
        self.comm_stats = SimpleNamespace(bytes_sent=0)

    def _seen(self, *tensors: torch.Tensor) -> None:
        self.devices += [t.device for t in tensors]
        if self.stop:
            raise _Stop

    def all_gather(self, full, shard, name="", async_op=False):
        self._seen(full, shard)

    def all_reduce(self, tensor, name="", async_op=False, op="sum"):
        self._seen(tensor)

    def broadcast(self, tensor, name=""):
        self._seen(tensor)

    def send(self, tensor, to, name=""):
        self._seen(tensor)

    def recv(self, tensor, source=None, name=""):
        self._seen(tensor)

    def start_exchange(self, sends=(), recvs=(), *, name, op=None):
        self._seen(*(t for _, t in sends), *(t for _, t in recvs))


def _communicator_class(recorder: _Recorder) -> type:
    """What a module's ``Communicator`` name becomes: every one built is ``recorder``."""

    class _Communicator:
        def __new__(cls, *args, **kwargs):
            return recorder

        among = staticmethod(lambda *args, **kwargs: recorder)

    return _Communicator


def test_sharded_muon_gathers_the_momentum_into_a_buffer_on_its_device():
    from dtlab.optim.muon import sharded_muon_updates

    comm = _Recorder(world_size=1)
    with pytest.raises(_Stop):
        sharded_muon_updates([torch.empty(16, device=META)], [(4, 4)], comm, "replicated")
    assert comm.devices == [META, META]


def test_dedup_count_messages_travel_on_the_rows_device():
    from dtlab.parallel.expert.dedup import _exchange

    comm = _Recorder()
    out = {1: (torch.empty(3, 4, device=META), torch.empty(3, 2, dtype=torch.int64, device=META))}
    with pytest.raises(_Stop):
        _exchange(comm, out, [1], "moe_dedup_inter", 4)
    assert comm.devices == [META, META]  # the one-word count sent and the one received


@pytest.mark.parametrize("method", ["funnel", "broadcast", "reshard"])
def test_weight_sync_engines_receive_on_the_ranks_device(monkeypatch, method):
    from dtlab.checkpoint import weight_sync

    recorder = _Recorder()
    monkeypatch.setattr(weight_sync, "Communicator", _communicator_class(recorder))
    monkeypatch.setattr(context, "device", lambda: META)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)  # the engine rank
    layout = weight_sync.SyncLayout((0,), (1,), {"w": (4, 2)}, {"w": 0})
    with pytest.raises(_Stop):
        weight_sync.sync_weights(layout, method, {})
    assert recorder.devices == [META]


def test_weight_sync_first_trainer_assembles_on_its_shards_device(monkeypatch):
    from dtlab.checkpoint import weight_sync

    recorder = _Recorder()
    monkeypatch.setattr(weight_sync, "Communicator", _communicator_class(recorder))
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)  # trainer 0 gathers trainer 2
    layout = weight_sync.SyncLayout((0, 2), (1,), {"w": (4, 2)}, {"w": 0})
    with pytest.raises(_Stop):
        weight_sync.sync_weights(layout, "funnel", {"w": torch.empty(4, device=META)})
    assert recorder.devices == [META]


def test_clipping_with_no_gradient_here_all_reduces_on_the_ranks_device(monkeypatch):
    from dtlab.parallel.zero.grad_clip import clip_sharded_grad_norm_

    monkeypatch.setattr(context, "device", lambda: META)
    comm = _Recorder(stop=False)
    norm = clip_sharded_grad_norm_([None], 1.0, comm)
    assert comm.devices == [META] and norm.device == META


def test_unused_parameter_flags_of_a_model_without_parameters_sit_on_the_ranks_device(
    monkeypatch,
):
    from dtlab.parallel.data.base import DataParallelBase

    monkeypatch.setattr(context, "device", lambda: META)
    flags = DataParallelBase._usage_flags(SimpleNamespace(params=[], _local_usage=[]))
    assert flags.device == META


def test_shard_sequence_returns_positions_on_the_tokens_device():
    from dtlab.parallel.context import shard_sequence

    x = torch.empty(2, 3, 8, 4, device=META)
    for style in ("zigzag", "contiguous"):
        local, positions = shard_sequence(x, 2, 1, style, dim=2)
        assert local.device == positions.device == META


@pytest.mark.parametrize("method", ["ring", "ulysses", "allgather"])
def test_context_parallel_attention_refuses_positions_off_the_queries_device(method):
    from dtlab.parallel import context as cp

    attention = getattr(cp, f"{method}_attention")
    q = torch.empty(1, 2, 8, 4, device=META)
    comm = _Recorder(world_size=1)
    with pytest.raises(ValueError, match=r"positions_q on q's device \(meta\), got cpu"):
        attention(q, q, q, torch.arange(8), torch.arange(8), comm)
    assert comm.devices == []  # refused before any message


def _pretend_nccl(monkeypatch) -> None:
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")


def test_async_sgd_refuses_nccl_and_names_gloo(monkeypatch):
    from dtlab.parallel.data.async_sgd import run_async_sgd

    _pretend_nccl(monkeypatch)
    with pytest.raises(ValueError, match=r"NCCL cannot do: run it on gloo"):
        run_async_sgd(torch.nn.Linear(2, 1), lambda model, step: model.weight.sum(), 1, 0.1)


def test_a_receive_from_any_rank_refuses_nccl_and_says_what_to_pass(monkeypatch):
    from dtlab.comm.messages import recv_from_anyone

    _pretend_nccl(monkeypatch)
    comm = SimpleNamespace(via="torch", group=None)
    with pytest.raises(ValueError, match=r"Pass source=<group rank>, or run on gloo"):
        recv_from_anyone(comm, torch.empty(1), "recv")
