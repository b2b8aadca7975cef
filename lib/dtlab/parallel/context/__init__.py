"""Context parallelism: split the *sequence* over ranks and keep attention exact.

* :mod:`.blockwise` — attention one key block at a time, merged by log-sum-exp (online softmax);
* :mod:`.ring` — ring attention: K/V blocks rotate, Q stays; causal blocks skipped;
* :mod:`.sharding` — contiguous and zig-zag (load-balanced causal) token layouts, positions explicit;
* :mod:`.ulysses` — DeepSpeed-Ulysses: all-to-all sequence ↔ heads around full attention;
* :mod:`.allgather` — Llama 3's variant: all-gather K/V, attend locally (for comparison);
* :mod:`.documents` — packed documents: the document mask in the ring (blocks no document spans
  skipped), the imbalance it brings back, and document-aware zig-zag sharding;
* :mod:`.agreement` — before any K/V moves, the ranks check they hold shards of one shape;
* :mod:`.model` — apply either to the lab GPT from outside.
"""

from dtlab.parallel.context.allgather import allgather_attention, allgather_core
from dtlab.parallel.context.blockwise import (
    block_attention,
    block_attention_backward,
    merge,
    unmasked_scores,
)
from dtlab.parallel.context.documents import (
    document_ring_attention,
    document_zigzag_positions,
)
from dtlab.parallel.context.model import (
    CP_STYLES,
    average_gradients,
    parallelize_context,
    shard_batch,
)
from dtlab.parallel.context.ring import AttentionWork, ring_attention, ring_core
from dtlab.parallel.context.sharding import shard_positions, shard_sequence, unshard_sequence
from dtlab.parallel.context.ulysses import check_heads, ulysses_attention, ulysses_core

__all__ = [
    "CP_STYLES",
    "AttentionWork",
    "allgather_attention",
    "allgather_core",
    "average_gradients",
    "block_attention",
    "block_attention_backward",
    "check_heads",
    "document_ring_attention",
    "document_zigzag_positions",
    "merge",
    "parallelize_context",
    "ring_attention",
    "ring_core",
    "shard_batch",
    "shard_positions",
    "shard_sequence",
    "ulysses_attention",
    "ulysses_core",
    "unmasked_scores",
    "unshard_sequence",
]
