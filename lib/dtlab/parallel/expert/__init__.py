"""Expert parallelism: a mixture-of-experts layer's experts sharded over the ``ep`` mesh group.

* :mod:`.exchange` — the token exchange: one count message per peer that is also the call's
  agreement, each payload posted in one call into buffers kept across steps;
* :mod:`.dedup` — the deduplicated dispatch: each token once per destination node, then fanned
  out inside the node (DeepEP's idea), with its bytes per link class;
* :mod:`.dispatch` — the count exchange, dispatch all-to-all, expert compute, combine all-to-all;
* :mod:`.tensor_split` — an MoE layer inside a tensor-parallel group: each TP rank routes its own
  slice of the tokens (expert-TP = 1; MoE parallel folding);
* :mod:`.model` — apply it to the lab GPT from outside, and average gradients over ``dp``
  (dense parameters) and ``edp`` (expert parameters), and keep DeepSeek-V3's balancing bias equal
  on every rank (loads summed over ``dp``).
"""

from dtlab.parallel.expert.dedup import DedupResult, dedup_dispatch
from dtlab.parallel.expert.dispatch import AllToAllDispatch, dispatch_splits
from dtlab.parallel.expert.exchange import Splits, TokenExchange, exchange_rows
from dtlab.parallel.expert.model import (
    ExpertParallel,
    average_gradients,
    parallelize_experts,
    update_balancing_biases,
)

__all__ = [
    "AllToAllDispatch",
    "DedupResult",
    "ExpertParallel",
    "Splits",
    "TokenExchange",
    "average_gradients",
    "dedup_dispatch",
    "dispatch_splits",
    "exchange_rows",
    "parallelize_experts",
    "update_balancing_biases",
]
