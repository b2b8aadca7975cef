"""``dtlab doctor --network``: each check reads another machine's files as well as this one's, says
what it found and what to change, and reports n/a — never "fine" — for what it cannot check."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from dtlab.cli import doctor
from dtlab.cli import doctor_network as net

DGX_TOPO = """\
        GPU0    GPU1    GPU2    GPU3    NIC0    NIC1    CPU Affinity    NUMA Affinity
GPU0     X      NV18    NV18    NV18    PXB     SYS     0-55    0
GPU1    NV18     X      NV18    NV18    SYS     PXB     0-55    0
GPU2    NV18    NV18     X      NV18    SYS     SYS     56-111  1
GPU3    NV18    NV18    NV18     X      SYS     SYS     56-111  1
NIC0    PXB     SYS     SYS     SYS      X      SYS
NIC1    SYS     PXB     SYS     SYS     SYS      X

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""

PCIE_TOPO = """\
        GPU0    GPU1    CPU Affinity
GPU0     X      SYS     0-7
GPU1    SYS      X      0-7
"""


def _interface(root: Path, name: str, state: str, speed: str, kind: str = "1") -> None:
    (root / name).mkdir(parents=True)
    (root / name / "operstate").write_text(state + "\n")
    (root / name / "speed").write_text(speed + "\n")
    (root / name / "type").write_text(kind + "\n")


def test_two_real_interfaces_without_nccl_socket_ifname_warn_and_name_both(tmp_path):
    _interface(tmp_path, "lo", "unknown", "-1", "772")
    _interface(tmp_path, "eth0", "up", "1000")
    _interface(tmp_path, "ib0", "up", "400000")
    check = net.check_interfaces(tmp_path, env={})
    assert not check.ok and check.checked
    assert "eth0 (1000 Mb/s)" in check.detail and "lo (loopback)" in check.detail
    assert "NCCL_SOCKET_IFNAME" in check.fix and "eth0, ib0" in check.fix
    named = net.check_interfaces(tmp_path, env={"NCCL_SOCKET_IFNAME": "ib0"})
    assert named.ok and "NCCL_SOCKET_IFNAME=ib0" in named.detail


def test_a_host_name_on_loopback_is_flagged_for_multi_node_runs():
    looped = net.check_loopback(env={}, resolve=lambda host: "127.0.1.1")
    assert not looped.ok and "MASTER_ADDR" in looped.fix
    real = net.check_loopback(env={"MASTER_ADDR": "10.0.0.1"}, resolve=lambda host: "10.0.0.7")
    assert real.ok and "MASTER_ADDR=10.0.0.1" in real.detail


def test_rdma_ports_report_state_rate_and_link_layer(tmp_path):
    for device, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        port = tmp_path / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state)
        (port / "rate").write_text("400 Gb/sec (4X NDR)")
        (port / "link_layer").write_text("InfiniBand")
    check = net.check_rdma(tmp_path)
    assert "mlx5_0/1 ACTIVE 400 Gb/sec (4X NDR) InfiniBand" in check.detail
    assert not check.ok and "mlx5_1/1" in check.fix


def test_gpudirect_needs_peermem_only_where_a_driver_and_an_rdma_nic_meet(tmp_path):
    modules, driver, ib = tmp_path / "modules", tmp_path / "driver", tmp_path / "ib"
    assert not net.check_gpudirect(modules, driver, ib).checked  # no driver: n/a
    driver.mkdir()
    (ib / "mlx5_0").mkdir(parents=True)
    modules.write_text("nvidia 1 0 - Live 0x0\n")
    missing = net.check_gpudirect(modules, driver, ib)
    assert not missing.ok and "modprobe nvidia_peermem" in missing.fix
    modules.write_text("nvidia 1 0 - Live 0x0\nnvidia_peermem 1 0 - Live 0x0\n")
    assert net.check_gpudirect(modules, driver, ib).ok


def test_topology_counts_nvlink_pairs_and_the_gpu_next_to_each_nic():
    matrix = net.parse_topology(DGX_TOPO)
    assert matrix["GPU0"]["GPU3"] == "NV18" and matrix["NIC1"]["GPU1"] == "PXB"
    summary, problems = net.topology_findings(matrix)
    assert "4 GPUs, 6/6 pairs on NVLink" in summary
    assert "NIC0→GPU0" in summary and "NIC1→GPU1" in summary
    assert problems == []
    summary, problems = net.topology_findings(net.parse_topology(PCIE_TOPO))
    assert "0/1 pairs on NVLink" in summary
    assert "GPU0-GPU1 SYS" in problems[0] and "TP groups" in problems[0]


def test_topology_runs_nvidia_smi_where_there_is_one_and_says_n_a_where_not():
    absent = net.check_topology(which=lambda name: None)
    assert not absent.checked and "nvidia-smi not found" in absent.detail

    def fake_run(argv, **kwargs):
        assert argv == ["nvidia-smi", "topo", "-m"]
        return subprocess.CompletedProcess(argv, 0, stdout=DGX_TOPO, stderr="")

    found = net.check_topology(run=fake_run, which=lambda name: "/usr/bin/nvidia-smi")
    assert found.ok and found.checked and "6/6 pairs on NVLink" in found.detail


def test_nccl_debugging_switches_left_on_are_named():
    check = net.check_nccl_switches({"NCCL_IB_DISABLE": "1", "NCCL_NET_GDR_LEVEL": "LOC"})
    assert not check.ok and "NCCL_IB_DISABLE=1" in check.detail and "GDR" in check.detail
    assert net.check_nccl_switches({}).ok


def test_doctor_network_runs_here_and_marks_what_it_cannot_check(capsys):
    parser = __import__("argparse").ArgumentParser()
    doctor.register(parser)
    args = parser.parse_args(["--network"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    for name in (
        "interfaces",
        "loopback vs real",
        "RDMA devices",
        "GPUDirect RDMA",
        "GPU topology",
    ):
        assert name in out
    checks = net.network_report()
    unchecked = [c for c in checks if not c.checked]
    assert all(c.ok for c in unchecked), "a check that could not run never fails the report"
    if shutil.which("nvidia-smi") is None:  # no GPU here: the topology check says so
        assert "n/a   GPU topology" in out
