"""Datasheet numbers for links and GPUs, with where each one comes from.

Units: bandwidths are decimal bytes per second (1 GB/s = 1e9 B/s), link bandwidths are **per
direction** (one GPU sending to the other while the reverse direction is equally busy), FLOP/s are
per GPU, and **HBM capacities are what the driver reports**, in binary units: a datasheet's
"80 GB" of HBM is about 80 GiB, not 80e9 bytes — DRAM dies come in binary densities, five 16 GiB
stacks make the A100's and H100's 80 — and ``nvidia-smi`` shows each board's total in MiB:
40,960 (A100 40GB), 81,920 (A100 80GB: 85.9e9 bytes), 81,559 (H100 SXM), 143,771 (H200,
"141 GB") and 183,359 (B200, "180 GB"), as published ``nvidia-smi`` outputs of these GPUs read.
The H800 is taken as the H100's 81,559: the same 80 GB of HBM3, no published total found.
Until 2026-11 dtlab read them as decimal (80e9), 7 % short of what a plan can use.

Latencies (``alpha_s``) are order-of-magnitude figures for a NCCL/MPI message over that fabric,
not datasheet values: real ones depend on protocol, message path and software. Fit your own with
a measured sweep and use the fitted :class:`~dtlab.cost.alpha_beta.Link` instead.

Links:

* **NVLink 4** (H100 SXM5): 18 links × 25 GB/s per direction = **450 GB/s per direction per GPU**;
  NVIDIA's headline "900 GB/s" is the *bidirectional aggregate* (450 out + 450 in).
  Source: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), NVLink section; H100 datasheet.
* **NVLink 3** (A100 SXM4): 12 links × 25 GB/s = 300 GB/s per direction ("600 GB/s" bidirectional).
  Source: NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020).
* **PCIe Gen5 x16**: 32 GT/s × 16 lanes with 128b/130b encoding = 63.0 GB/s per direction
  (marketed as "128 GB/s", again bidirectional). Source: PCI-SIG PCIe 5.0 specification.
* **PCIe Gen4 x16**: 16 GT/s × 16 lanes, 128b/130b = 31.5 GB/s per direction.
* **InfiniBand NDR**: 400 Gb/s per port = **50 GB/s per direction per port** (bits, not bytes:
  divide by 8). Source: NVIDIA ConnectX-7 / Quantum-2 datasheets. HDR: 200 Gb/s = 25 GB/s.
* **Ethernet** 100 GbE = 12.5 GB/s and 200 GbE = 25 GB/s per direction (IEEE 802.3 line rates).
* **cpu_gloo_loopback**: a *placeholder* for gloo over TCP loopback between CPU processes on one
  machine, the fabric the CPU labs actually run on. Its numbers are a rough guess that is meant to
  be **replaced by fitting α and β to a measured sweep** on your machine.

GPUs (dense tensor-core peaks; NVIDIA headline figures "with sparsity" are exactly 2× these):

* **A100 SXM4**: 312 TFLOP/s BF16 dense (624 sparse), no FP8. 40 GB HBM2 at 1,555 GB/s; 80 GB HBM2e
  at 2,039 GB/s. Source: NVIDIA A100 datasheet.
* **H100 SXM5**: ~989 TFLOP/s BF16 dense (989.4) — the often-quoted **1,979 is the 2:4-sparse
  figure**; FP8 dense 1,979 (3,958 sparse). 80 GB HBM3 at 3.35 TB/s. Sources: NVIDIA H100 datasheet;
  H100 architecture whitepaper, which gives the unrounded 989.4 / 1,978.9.
* **H200 SXM**: the same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s. Source: NVIDIA H200 datasheet.
* **H800 SXM**: the H100's compute and 80 GB HBM3 with NVLink cut to 400 GB/s bidirectional,
  **200 GB/s per direction** (8 links instead of 18; DeepSeek-AI 2024, "DeepSeek-V3 Technical
  Report", Sec. 3.2.2, measures ~160 GB/s achievable on it, and 50 GB/s per InfiniBand NIC).
* **B200 (HGX/DGX B200)**: ~2,250 TFLOP/s BF16 dense, 4,500 FP8 dense (the headline 9 PFLOP/s
  FP8 is 2:4-sparse); 180 GB HBM3e per GPU in DGX B200 (1,440 GB for 8) at ~7.7 TB/s; NVLink 5,
  1.8 TB/s bidirectional = **900 GB/s per direction**. Source: NVIDIA DGX B200 / HGX B200
  datasheets (2024).

Host links: H100/H200 SXM attach to the host over PCIe Gen5 x16, A100 SXM4 over PCIe Gen4 x16
(the datasheets' "PCIe Gen5: 128 GB/s" and "PCIe Gen4: 64 GB/s" are bidirectional totals).

**Fabrics** (:class:`Fabric`, :data:`FABRICS`): a node type as a job states it — GPU preset, GPUs per
NVLink domain (a node here), NICs per node and their speed. ``dgx_a100_hdr200``: DGX A100 with
eight 200 Gb/s HDR HCAs for compute (Megatron-LM 2021 ran on Selene, DGX A100 80 GB / HDR);
``dgx_h100_ndr400``, ``dgx_h200_ndr400``, ``dgx_b200_ndr400``: eight 400 Gb/s NICs (DGX
reference architectures; Llama 3's Grand Teton nodes also give each GPU a 400 Gb/s RoCE NIC,
Dubey et al. 2024, Sec. 3.3.1); ``h800_ib400``: DeepSeek-V3's nodes, eight H800 with one 400 Gb/s
InfiniBand NIC each (Sec. 3.2.2: "IB 50 GB/s").

**Network topology.** One NIC per GPU, rail-optimised (NVIDIA DGX H100 / DGX SuperPOD reference
architecture: eight ConnectX-7 400 Gb/s ports per node, NIC ``j`` of every node on rail ``j``);
:class:`dtlab.cost.hierarchy.TwoTierCluster` models it and the one-NIC-per-node alternative.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlab.cost.alpha_beta import Link

GB = 1e9
MIB = 2**20
TFLOP = 1e12

NVLINK4_H100 = Link(alpha_s=2e-6, bandwidth_bytes_per_s=450 * GB, name="NVLink4 (H100 SXM)")
NVLINK_H800 = Link(
    alpha_s=2e-6, bandwidth_bytes_per_s=200 * GB, name="NVLink (H800, 400 GB/s bidir)"
)
NVLINK5_B200 = Link(alpha_s=2e-6, bandwidth_bytes_per_s=900 * GB, name="NVLink5 (B200)")
NVLINK3_A100 = Link(alpha_s=2e-6, bandwidth_bytes_per_s=300 * GB, name="NVLink3 (A100 SXM)")
PCIE_GEN5_X16 = Link(alpha_s=3e-6, bandwidth_bytes_per_s=63.0 * GB, name="PCIe Gen5 x16")
PCIE_GEN4_X16 = Link(alpha_s=3e-6, bandwidth_bytes_per_s=31.5 * GB, name="PCIe Gen4 x16")
IB_NDR_400 = Link(alpha_s=5e-6, bandwidth_bytes_per_s=50 * GB, name="InfiniBand NDR 400 Gb/s")
IB_HDR_200 = Link(alpha_s=5e-6, bandwidth_bytes_per_s=25 * GB, name="InfiniBand HDR 200 Gb/s")
ETHERNET_100G = Link(alpha_s=10e-6, bandwidth_bytes_per_s=12.5 * GB, name="Ethernet 100 Gb/s")
ETHERNET_200G = Link(alpha_s=10e-6, bandwidth_bytes_per_s=25 * GB, name="Ethernet 200 Gb/s")
CPU_GLOO_LOOPBACK = Link(
    alpha_s=50e-6, bandwidth_bytes_per_s=2 * GB, name="gloo TCP loopback (placeholder: fit me)"
)

LINKS: dict[str, Link] = {
    "nvlink4": NVLINK4_H100,
    "nvlink3": NVLINK3_A100,
    "nvlink_h800": NVLINK_H800,
    "nvlink5": NVLINK5_B200,
    "pcie_gen5_x16": PCIE_GEN5_X16,
    "pcie_gen4_x16": PCIE_GEN4_X16,
    "ib_ndr_400": IB_NDR_400,
    "ib_hdr_200": IB_HDR_200,
    "ethernet_100g": ETHERNET_100G,
    "ethernet_200g": ETHERNET_200G,
    "cpu_gloo_loopback": CPU_GLOO_LOOPBACK,
}


@dataclass(frozen=True)
class GPUSpec:
    """Peak numbers of one GPU (see the module docstring for sources).

    Attributes:
        bf16_dense_flops: dense BF16/FP16 tensor-core FLOP/s — the number MFU is measured against.
        bf16_sparse_flops: the 2:4 structured-sparsity figure (2× dense), for recognising it.
        fp8_dense_flops: dense FP8 FLOP/s, or ``None`` where the GPU has no FP8 tensor cores.
        hbm_bytes: memory capacity in bytes, as the driver reports it (module docstring).
        hbm_bandwidth_bytes_per_s: memory bandwidth in decimal bytes per second.
        nvlink: the GPU's NVLink, per direction.
        host_link: the GPU's PCIe link to host memory, per direction (what a device-to-host
            snapshot of the training state, e.g. for an asynchronous checkpoint, runs at).
        sm_count: streaming multiprocessors, the units a GEMM's output tiles are spread over
            in waves (:mod:`dtlab.plan.gemm`): A100 108, H100/H800/H200 SXM 132, B200 148
            (NVIDIA A100 and H100 architecture whitepapers; Blackwell: 148 SMs per B200).
    """

    name: str
    bf16_dense_flops: float
    bf16_sparse_flops: float
    fp8_dense_flops: float | None
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    nvlink: Link
    host_link: Link = PCIE_GEN5_X16
    sm_count: int = 132


A100_40GB = GPUSpec(
    "A100 SXM4 40GB", 312 * TFLOP, 624 * TFLOP, None, 40960 * MIB, 1555 * GB, NVLINK3_A100,
    PCIE_GEN4_X16, sm_count=108,
)  # fmt: skip
A100_80GB = GPUSpec(
    "A100 SXM4 80GB", 312 * TFLOP, 624 * TFLOP, None, 81920 * MIB, 2039 * GB, NVLINK3_A100,
    PCIE_GEN4_X16, sm_count=108,
)  # fmt: skip
H100_SXM = GPUSpec(
    "H100 SXM5 80GB",
    989.4 * TFLOP,
    1978.9 * TFLOP,
    1978.9 * TFLOP,
    81559 * MIB,
    3350 * GB,
    NVLINK4_H100,
    sm_count=132,
)
H200_SXM = GPUSpec(
    "H200 SXM 141GB",
    989.4 * TFLOP,
    1978.9 * TFLOP,
    1978.9 * TFLOP,
    143771 * MIB,
    4800 * GB,
    NVLINK4_H100,
    sm_count=132,
)

H800_SXM = GPUSpec(
    "H800 SXM5 80GB",
    989.4 * TFLOP,
    1978.9 * TFLOP,
    1978.9 * TFLOP,
    81559 * MIB,
    3350 * GB,
    NVLINK_H800,
    sm_count=132,
)
B200 = GPUSpec(
    "B200 180GB",
    2250 * TFLOP,
    4500 * TFLOP,
    4500 * TFLOP,
    183359 * MIB,
    7700 * GB,
    NVLINK5_B200,
    PCIE_GEN5_X16,
    sm_count=148,
)

GPUS: dict[str, GPUSpec] = {
    "a100_40gb": A100_40GB,
    "a100_80gb": A100_80GB,
    "h100_sxm": H100_SXM,
    "h800_sxm": H800_SXM,
    "h200_sxm": H200_SXM,
    "b200": B200,
}


@dataclass(frozen=True)
class Fabric:
    """A node type: which GPU, how many share an NVLink domain, and the NICs that leave the node.

    ``nic`` is one NIC's link (per direction); ``nics_per_node`` of them serve the node's
    ``gpus_per_node`` GPUs (eight rail-optimised NICs on every DGX-class node)."""

    name: str
    gpu: str
    gpus_per_node: int
    nics_per_node: int
    nic: Link


FABRICS: dict[str, Fabric] = {
    "dgx_a100_40gb_hdr200": Fabric("DGX A100 40GB, 8x HDR 200", "a100_40gb", 8, 8, IB_HDR_200),
    "dgx_a100_hdr200": Fabric("DGX A100 80GB, 8x HDR 200", "a100_80gb", 8, 8, IB_HDR_200),
    "dgx_h100_ndr400": Fabric("DGX H100, 8x NDR 400", "h100_sxm", 8, 8, IB_NDR_400),
    "h800_ib400": Fabric("H800 node, 8x IB 400", "h800_sxm", 8, 8, IB_NDR_400),
    "dgx_h200_ndr400": Fabric("DGX H200, 8x NDR 400", "h200_sxm", 8, 8, IB_NDR_400),
    "dgx_b200_ndr400": Fabric("DGX B200, 8x NDR 400", "b200", 8, 8, IB_NDR_400),
}


def fabric(name: str) -> Fabric:
    """The preset node type called ``name`` (one of :data:`FABRICS`)."""
    try:
        return FABRICS[name]
    except KeyError:
        raise KeyError(f"no fabric preset {name!r}; choose one of {sorted(FABRICS)}") from None


def link(name: str) -> Link:
    """The preset link called ``name`` (one of :data:`LINKS`)."""
    try:
        return LINKS[name]
    except KeyError:
        raise KeyError(f"no link preset {name!r}; choose one of {sorted(LINKS)}") from None


def gpu(name: str) -> GPUSpec:
    """The preset GPU called ``name`` (one of :data:`GPUS`)."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"no GPU preset {name!r}; choose one of {sorted(GPUS)}") from None
