"""Quiz-bank claims recomputed by hand, under the model and hardware each prompt names.

Each test catches one class of defect found in review (issue 33): a key computed for a different
model than the prompt names (a two-matrix MLP for a gated Llama one; an FP8 combine for
DeepSeek-V3's BF16 one), a scenario the hardware cannot produce, and explanation numbers that
disagree with the library's own report.
"""

from __future__ import annotations

import math
import re

import pytest

from dtlab.cost.hardware import gpu, link
from dtlab.cost.nccl_protocols import in_network_busbw
from dtlab.quiz import compute_key, load_bank
from dtlab.quiz.keys import _evaluate_call

H100 = gpu("h100_sxm").bf16_dense_flops
NVLINK4 = link("nvlink4").bandwidth_bytes_per_s
NIC = link("ib_ndr_400").bandwidth_bytes_per_s


def _keyed_on(function: str) -> list:
    return [
        item
        for item in load_bank().values()
        if item.kind == "numeric" and item.key.call.endswith(":" + function)
    ]


@pytest.mark.parametrize(
    ("item_id", "bandwidth"),
    [("performance.tp_max_degree", NVLINK4), ("performance.tp_across_nodes", NIC)],
)
def test_gated_mlp_tp_bound_counts_three_matrices(item_id, bandwidth):
    # 2·3·d·F/t FLOPs against 2(t-1)/t·2·d bytes: t ≤ 1 + 3·F·B / (2·C)
    by_hand = math.floor(1 + 3 * 28672 * bandwidth / (2 * H100))
    assert compute_key(load_bank()[item_id]) == by_hand
    assert by_hand in (20, 3)


def test_every_tp_item_that_names_a_gated_or_llama_mlp_passes_three_matrices():
    unmatched = [
        item.id
        for item in _keyed_on("tp_max_degree")
        if re.search(r"gated|Llama|SwiGLU", item.prompt) and item.key.kwargs.get("matrices") != 3
    ]
    assert not unmatched, f"a gated MLP has three weight matrices: {unmatched}"


@pytest.mark.parametrize(
    ("item_id", "ep", "bandwidth"),
    [
        ("performance.ep_ratio_across_nodes", 64, NIC),
        ("system_design.intra_node_ep_ratio", 8, NVLINK4),
    ],
)
def test_deepseek_ep_ratio_combines_in_bf16(item_id, ep, bandwidth):
    # 2·3·d·F_e FLOPs against d·(1 B dispatch + 2 B combine)·(ep-1)/ep
    by_hand = 6 * 2048 / (3 * (ep - 1) / ep * H100 / bandwidth)
    assert compute_key(load_bank()[item_id]) == pytest.approx(by_hand)
    assert round(by_hand, 2) in (0.21, 2.13)


def test_every_fp8_dispatch_item_states_its_combine_bytes():
    unstated = [
        item.id
        for item in _keyed_on("ep_compute_to_comm_ratio")
        if item.key.kwargs.get("act_bytes") == 1 and "combine_bytes" not in item.key.kwargs
    ]
    assert not unstated, f"DeepSeek-V3 dispatches in FP8 but combines in BF16: {unstated}"


def test_in_network_busbw_items_fit_on_the_link():
    for item in _keyed_on("in_network_busbw"):
        report = _evaluate_call(item.key)
        assert report["sent_per_gpu"] <= NVLINK4, (
            f"{item.id}: each GPU would put {report['sent_per_gpu'] / 1e9:.0f} GB/s on a "
            f"{NVLINK4 / 1e9:.0f} GB/s link"
        )


def test_in_network_busbw_sends_the_buffer_plus_one_slice():
    nbytes, seconds, n = 1e9, 4e-3, 8
    report = in_network_busbw(nbytes, seconds, n)
    # the switch reads each GPU's whole buffer once, and each GPU sends back the 1/n slice it reduced
    by_hand = (nbytes + nbytes / n) / seconds
    assert report["sent_per_gpu"] == pytest.approx(by_hand)
    assert report["busbw"] / report["sent_per_gpu"] == pytest.approx(2 * (n - 1) / (n + 1))


def test_mfu_item_explanation_quotes_the_report():
    item = load_bank()["performance.mfu_conventions"]
    report = _evaluate_call(item.key)
    labels = {
        "6N": "mfu_6n",
        "causal": "mfu_causal_attention",
        "full square": "mfu_full_attention",
        "HFU": "hfu_recompute_full_attention",
    }
    quoted = {
        label: int(percent)
        for percent, label in re.findall(r"(\d+)% \(([^)]+)\)", item.explanation)
    }
    assert set(quoted) == set(labels)
    for label, field in labels.items():
        assert quoted[label] == round(100 * report[field]), label


def test_llama3_dp_margin_is_stated_for_one_nic_per_gpu():
    # TP 8 fills the node, so each DP group has one 50 GB/s NIC per GPU: crossover 20K-39K tokens
    ring = 2 * 127 / 128
    bf16, fp32 = (ring * b * H100 / (4 * NIC) for b in (2, 4))
    margins = (2**24 / 128 / fp32, 2**24 / 128 / bf16)
    assert 3 < margins[0] < 4 and 6 < margins[1] < 7
    overstated = re.compile(r"~50× above|crossover of a few thousand|far above the DP crossover")
    offenders = [
        item.id
        for item in load_bank().values()
        if overstated.search(
            " ".join([item.prompt, item.explanation, *(c.why for c in item.choices)])
        )
    ]
    assert not offenders, f"with one NIC per GPU the DP margin is ~3-7×: {offenders}"


def test_mixed_precision_adam_bytes_add_up():
    text = load_bank()["precision.master_weights"].explanation
    assert "2 + 4 + 8 = 14" in text and "16 B/param once" in text
