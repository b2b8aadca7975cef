"""Ranks listen on loopback only, and leave their process group cleanly when the Cluster closes."""

from __future__ import annotations

import ipaddress
import os

import torch
import torch.distributed as dist

import dtlab
from dtlab import Cluster
from dtlab.runtime.devices import loopback_interface
from dtlab.runtime.pool import rank_environment


def _listening_addresses() -> tuple[str | None, list[str]]:
    """This process's GLOO_SOCKET_IFNAME and the addresses of its listening TCP sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    addresses = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/self/net/{table}") as f:
            for row in list(f)[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    raw = bytes.fromhex(cols[1].split(":")[0])
                    # /proc prints each 32-bit word of the address in host (little-endian) order
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    addresses.append(str(ipaddress.ip_address(words)))
    return os.environ.get("GLOO_SOCKET_IFNAME"), addresses


def test_ranks_listen_on_the_loopback_interface_only(cluster2):
    assert loopback_interface() is not None  # this test needs a Linux /proc and sysfs
    for interface, addresses in cluster2.run(_listening_addresses):
        assert interface == loopback_interface()
        assert addresses, "gloo keeps a listening socket; none was found"
        assert all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses


def test_a_gloo_interface_the_user_chose_is_kept():
    chosen = rank_environment(0, 2, {"GLOO_SOCKET_IFNAME": "eth7"}, parent_env={})
    assert chosen["GLOO_SOCKET_IFNAME"] == "eth7"
    inherited = rank_environment(1, 2, {}, parent_env={"GLOO_SOCKET_IFNAME": "eth3"})
    assert inherited["GLOO_SOCKET_IFNAME"] == "eth3"
    default = rank_environment(1, 2, {}, parent_env={})
    assert default["GLOO_SOCKET_IFNAME"] == loopback_interface()
    assert default["RANK"] == 1 and default["WORLD_SIZE"] == 2


def test_close_after_async_collectives_and_p2p_is_a_clean_exit():
    def asynchronous_traffic():
        peer = 1 - dtlab.rank()
        pending = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(4)]
        pending[0].wait()  # the rest are left for the worker to finish before it replies
        sent = dist.isend(torch.ones(8), peer)
        dist.irecv(torch.zeros(8), peer).wait()
        sent.wait()
        return len(pending)

    cluster = Cluster(2, device="cpu")
    assert cluster.run(asynchronous_traffic) == [4, 4]
    processes = list(cluster._pool.procs)
    cluster.close()
    # 0: left the group and returned. A teardown abort (-6) or a kill after the grace (-9) is not.
    assert [p.exitcode for p in processes] == [0, 0]
