"""The network checklist of ``dtlab doctor --network``: what a slow or hanging multi-node job
should be checked for first, each check saying what it found and what to change.

1. **interfaces** — which network interfaces are up, their speed, and which one gloo and NCCL
   will use (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``). With several up and none named,
   NCCL favours one whose name starts with ``ib`` and otherwise takes any that is not loopback or
   ``docker*`` (NCCL's environment-variable docs) — often the slow management port.
2. **loopback vs real** — what this host's name resolves to and what ``MASTER_ADDR`` is. A name
   that resolves to 127.x works for ``dtlab.Cluster`` (one machine, loopback on purpose) and
   fails the moment a second node tries to reach it.
3. **RDMA devices** — InfiniBand/RoCE adapters (``/sys/class/infiniband``), port state and rate.
   None: NCCL falls back to TCP sockets across nodes (``NET/Socket`` in ``NCCL_DEBUG=INFO``).
4. **GPUDirect RDMA** — the ``nvidia_peermem`` kernel module (older: ``nv_peer_mem``) that lets
   the NIC read GPU memory directly; without it (or DMA-BUF) NCCL stages every inter-node byte
   through host memory.
5. **GPU topology** — ``nvidia-smi topo -m``: GPU pairs joined by NVLink (``NV#``) against PCIe or
   the CPU interconnect (``PIX``/``PXB``/``PHB``/``NODE``/``SYS``), and which GPU each NIC sits
   next to (the rail it serves).
6. **NCCL switches** — ``NCCL_IB_DISABLE``, ``NCCL_P2P_DISABLE``, ``NCCL_NET_GDR_LEVEL`` left on
   from a debugging session silently cost bandwidth.

A check that cannot run here (no GPU, no RDMA hardware) says so — status ``n/a`` — instead of
passing or failing: this machine's answer is then "not checked", never "fine". Every check reads
files and the environment; only the topology runs a command (``nvidia-smi``, 10 s timeout).
Each function takes its inputs as arguments so tests can hand it another machine's files.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dtlab.cli.doctor_checks import Check

NET = Path("/sys/class/net")
INFINIBAND = Path("/sys/class/infiniband")
PROC_MODULES = Path("/proc/modules")
NVIDIA_DRIVER = Path("/proc/driver/nvidia")
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
NCCL_SWITCHES = {
    "NCCL_IB_DISABLE": "forces TCP sockets between nodes (a diagnosis switch, never a speed-up)",
    "NCCL_P2P_DISABLE": "stages GPU-to-GPU copies inside a node through host memory",
    "NCCL_SHM_DISABLE": "turns off the shared-memory transport between local ranks",
}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def check_interfaces(net: Path = NET, env: Mapping[str, str] = os.environ) -> Check:
    """The interfaces that are up (with speed), and the ones gloo and NCCL are told to use."""
    if not net.is_dir():
        return Check(
            "interfaces", True, f"{net} not readable: cannot list interfaces", checked=False
        )
    up, real = [], []
    for iface in sorted(p.name for p in net.iterdir()):
        state = _read(net / iface / "operstate")
        if state not in ("up", "unknown"):
            continue
        speed = _read(net / iface / "speed")
        loopback = iface == "lo" or _read(net / iface / "type") == "772"
        label = (
            "loopback" if loopback else (f"{speed} Mb/s" if speed and speed != "-1" else "speed ?")
        )
        up.append(f"{iface} ({label})")
        if not loopback and not iface.startswith(("docker", "veth", "virbr", "ifb")):
            real.append(iface)
    named = {k: env[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if env.get(k)}
    detail = f"up: {', '.join(up) or 'none'}; " + (
        ", ".join(f"{k}={v}" for k, v in named.items()) or "no *_SOCKET_IFNAME set"
    )
    if len(real) > 1 and "NCCL_SOCKET_IFNAME" not in named:
        return Check(
            "interfaces",
            False,
            detail,
            f"several real interfaces ({', '.join(real)}): set NCCL_SOCKET_IFNAME (and "
            "GLOO_SOCKET_IFNAME) to the one on the cluster network, or NCCL may bootstrap over "
            "the first it finds",
            essential=False,
        )
    return Check("interfaces", True, detail, essential=False)


def check_loopback(env: Mapping[str, str] = os.environ, resolve=socket.gethostbyname) -> Check:
    """Whether this host's name (and ``MASTER_ADDR``) resolve to loopback."""
    host = socket.gethostname()
    try:
        address = resolve(host)
    except OSError as error:
        return Check("loopback vs real", False, f"{host} does not resolve: {error}",
                     "add the host to /etc/hosts or DNS", essential=False)  # fmt: skip
    master = env.get("MASTER_ADDR")
    detail = f"{host} → {address}" + (f"; MASTER_ADDR={master}" if master else "")
    detail += "; dtlab.Cluster ranks use loopback on purpose (one machine)"
    looped = address.startswith("127.") or (master or "").startswith(("127.", "localhost"))
    if looped:
        return Check(
            "loopback vs real",
            False,
            detail,
            "fine on one machine; for torchrun across nodes set MASTER_ADDR to this node's "
            "cluster-network address and make the host name resolve to it (not 127.0.1.1)",
            essential=False,
        )
    return Check("loopback vs real", True, detail, essential=False)


def check_rdma(infiniband: Path = INFINIBAND) -> Check:
    """InfiniBand/RoCE adapters, their port state, rate and link layer."""
    if not infiniband.is_dir() or not any(infiniband.iterdir()):
        return Check(
            "RDMA devices",
            True,
            f"none ({infiniband} empty or absent): across nodes NCCL would use TCP sockets",
            checked=False,
        )
    ports, down = [], []
    for device in sorted(infiniband.iterdir()):
        for port in sorted((device / "ports").glob("*")):
            state = (_read(port / "state") or "?").split(":")[-1].strip()
            rate = _read(port / "rate") or "?"
            layer = _read(port / "link_layer") or "?"
            ports.append(f"{device.name}/{port.name} {state} {rate} {layer}")
            if state != "ACTIVE":
                down.append(f"{device.name}/{port.name}")
    detail = "; ".join(ports) or "devices without ports"
    if down:
        return Check("RDMA devices", False, detail,
                     f"ports not ACTIVE: {', '.join(down)} — check cables/switch (ibstat)",
                     essential=False)  # fmt: skip
    return Check("RDMA devices", True, detail, essential=False)


def check_gpudirect(
    proc_modules: Path = PROC_MODULES,
    driver: Path = NVIDIA_DRIVER,
    infiniband: Path = INFINIBAND,
) -> Check:
    """``nvidia_peermem`` loaded where there is both an NVIDIA driver and an RDMA NIC."""
    if not driver.exists():
        return Check("GPUDirect RDMA", True,
                     "no NVIDIA driver here: GPUDirect cannot apply", checked=False)  # fmt: skip
    loaded = {line.split()[0] for line in (_read(proc_modules) or "").splitlines() if line}
    found = [m for m in PEERMEM_MODULES if m in loaded]
    if found:
        return Check("GPUDirect RDMA", True, f"{found[0]} loaded", essential=False)
    has_nic = infiniband.is_dir() and any(infiniband.iterdir())
    return Check(
        "GPUDirect RDMA",
        not has_nic,
        "nvidia_peermem not loaded" + ("" if has_nic else " (no RDMA NIC either)"),
        "sudo modprobe nvidia_peermem (it ships with the driver), or use DMA-BUF (open kernel "
        "modules, kernel >= 5.12); without either, inter-node traffic is staged through host "
        "memory (NCCL_DEBUG=INFO shows no 'GDRDMA')",
        essential=False,
    )


def parse_topology(text: str) -> dict[str, dict[str, str]]:
    """``nvidia-smi topo -m``'s matrix as ``{row: {column: link}}`` for its GPU and NIC rows."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        return {}
    devices = [h for h in header if h.startswith(("GPU", "NIC", "mlx"))]
    matrix = {}
    for line in lines:
        cells = line.split()
        if cells and cells[0] in devices:
            matrix[cells[0]] = dict(zip(devices, cells[1 : 1 + len(devices)], strict=False))
    return matrix


def topology_findings(matrix: dict[str, dict[str, str]]) -> tuple[str, list[str]]:
    """A one-line summary of the matrix, and the problems in it."""
    gpus = [d for d in matrix if d.startswith("GPU")]
    nics = [d for d in matrix if not d.startswith("GPU")]
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    slow = [
        f"{a}-{b} {matrix[a].get(b)}" for a, b in pairs if not matrix[a].get(b, "").startswith("NV")
    ]
    problems = []
    if slow:
        problems.append(
            f"GPU pairs without NVLink: {', '.join(slow[:4])}{' …' if len(slow) > 4 else ''} — "
            "collectives between them cross PCIe/the CPU (tens of GB/s, not hundreds): keep "
            "TP groups on NVLink-joined GPUs"
        )
    rails = []
    for nic in nics:
        near = [g for g in gpus if matrix[nic].get(g) in ("PIX", "PXB")]
        rails.append(f"{nic}→{'/'.join(near) or 'none'}")
        if not near:
            problems.append(
                f"{nic} shares no PCIe switch with a GPU: GPUDirect traffic crosses the CPU"
            )
    summary = f"{len(gpus)} GPUs, {len(pairs) - len(slow)}/{len(pairs)} pairs on NVLink"
    return summary + (
        f"; NIC next to: {', '.join(rails)}" if rails else "; no NICs listed"
    ), problems


def check_topology(run=subprocess.run, which=shutil.which) -> Check:
    """Read ``nvidia-smi topo -m`` where there is an ``nvidia-smi``."""
    if which("nvidia-smi") is None:
        return Check("GPU topology", True,
                     "nvidia-smi not found: no GPU topology to read on this machine",
                     checked=False)  # fmt: skip
    try:
        done = run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Check("GPU topology", False, f"nvidia-smi topo -m failed: {error}",
                     "check the driver with nvidia-smi", essential=False)  # fmt: skip
    matrix = parse_topology(done.stdout)
    if not matrix:
        return Check("GPU topology", False, f"could not read the matrix: {done.stdout[:120]!r}",
                     "run nvidia-smi topo -m by hand", essential=False)  # fmt: skip
    summary, problems = topology_findings(matrix)
    return Check("GPU topology", not problems, summary, "; ".join(problems), essential=False)


def check_nccl_switches(env: Mapping[str, str] = os.environ) -> Check:
    """NCCL environment switches that cost bandwidth when left on."""
    on = [f"{k}={env[k]} ({why})" for k, why in NCCL_SWITCHES.items() if env.get(k) == "1"]
    if env.get("NCCL_NET_GDR_LEVEL") in ("0", "LOC"):
        on.append(f"NCCL_NET_GDR_LEVEL={env['NCCL_NET_GDR_LEVEL']} (GPUDirect RDMA off)")
    if on:
        return Check("NCCL switches", False, "; ".join(on),
                     "unset them for training: they are for diagnosis", essential=False)  # fmt: skip
    return Check("NCCL switches", True, "none of the slowing switches set", essential=False)


def network_report() -> list[Check]:
    """Every network check, in checklist order."""
    return [
        check_interfaces(),
        check_loopback(),
        check_rdma(),
        check_gpudirect(),
        check_topology(),
        check_nccl_switches(),
    ]
