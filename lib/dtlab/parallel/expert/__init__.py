"""Expert parallelism: a mixture-of-experts layer's experts sharded over the ``ep`` mesh group.

* :mod:`.dispatch` — the count exchange, dispatch all-to-all, expert compute, combine all-to-all;
* :mod:`.model` — apply it to the lab GPT from outside, and average gradients over ``dp``
  (dense parameters) and ``edp`` (expert parameters), and keep DeepSeek-V3's balancing bias equal
  on every rank (loads summed over ``dp``).
"""

from dtlab.parallel.expert.dispatch import AllToAllDispatch, dispatch_splits
from dtlab.parallel.expert.model import (
    ExpertParallel,
    average_gradients,
    parallelize_experts,
    update_balancing_biases,
)

__all__ = [
    "AllToAllDispatch",
    "ExpertParallel",
    "average_gradients",
    "dispatch_splits",
    "parallelize_experts",
    "update_balancing_biases",
]
