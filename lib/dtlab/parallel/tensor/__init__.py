"""Tensor and sequence parallelism (lab 04), applied to the lab GPT from outside.

Read in this order — each file one idea on top of the last:

* :mod:`~dtlab.parallel.tensor.layers` — column- and row-parallel Linear; entering and leaving
  a tensor-parallel region with Megatron's ``f``/``g`` (Shoeybi et al. 2019), or with
  all-gather / reduce-scatter along the sequence (Korthikanti et al. 2022).
* :mod:`~dtlab.parallel.tensor.blocks` — attention split by heads (GQA: by KV groups), the MLP
  by hidden width: two collectives per block per pass.
* :mod:`~dtlab.parallel.tensor.embedding` — the vocabulary-parallel embedding (tied head: the
  same shard); a vocabulary ``t`` does not divide is padded, as Megatron-LM does.
* :mod:`~dtlab.parallel.tensor.cross_entropy` — the loss from vocabulary-sharded logits,
  never gathering them.
* :mod:`~dtlab.parallel.tensor.sequence` — sequence parallelism's replicated parameters, whose
  gradients become partial sums.
* :mod:`~dtlab.parallel.tensor.parallelize` — :func:`parallelize_gpt`, the whole model.
* :mod:`~dtlab.parallel.tensor.backward_overlap` — the column layer's backward launching the
  input-gradient collective before wgrad and waiting after it (``backward_overlap=True``).
* :mod:`~dtlab.parallel.tensor.async_tp` — async TP (collective matmul): SP's forward all-gather
  and reduce-scatter cut into per-peer chunks under partial GEMMs.
* :mod:`~dtlab.parallel.tensor.overlap` — both measured on ranks: exposed vs total communication.
* :mod:`~dtlab.parallel.tensor.accounting` — bytes moved and held per rank, in closed form.
* :mod:`~dtlab.parallel.tensor.dtensor_plan` — the same split in PyTorch's DTensor TP, the
  production yardstick.
"""

from dtlab.parallel.tensor.async_tp import all_gather_matmul, matmul_reduce_scatter
from dtlab.parallel.tensor.backward_overlap import column_parallel_linear
from dtlab.parallel.tensor.blocks import (
    check_heads,
    enter_region_on_input,
    parallelize_attention,
    parallelize_block,
    parallelize_mlp,
)
from dtlab.parallel.tensor.cross_entropy import vocab_parallel_cross_entropy
from dtlab.parallel.tensor.dtensor_plan import (
    dtensor_loss_backward,
    dtensor_parallelize_gpt,
    dtensor_param_groups,
)
from dtlab.parallel.tensor.embedding import VocabParallelEmbedding, padded_vocab_size
from dtlab.parallel.tensor.layers import (
    SEQ_DIM,
    ColumnParallelLinear,
    RowParallelLinear,
    enter_region,
    leave_region,
)
from dtlab.parallel.tensor.overlap import (
    ExposedComm,
    OverlapMeasurement,
    measure_async_tp,
    measure_tp_backward_overlap,
    tp_overlap_figures,
)
from dtlab.parallel.tensor.parallelize import (
    TensorParallel,
    check_tensor_parallel,
    parallelize_gpt,
    tensor_parallel_check,
)
from dtlab.parallel.tensor.sequence import (
    SequenceShardedPositions,
    all_reduce_partial_grads,
    partial_grad_parameters,
)

__all__ = [
    "SEQ_DIM",
    "ColumnParallelLinear",
    "ExposedComm",
    "OverlapMeasurement",
    "RowParallelLinear",
    "SequenceShardedPositions",
    "TensorParallel",
    "VocabParallelEmbedding",
    "all_gather_matmul",
    "all_reduce_partial_grads",
    "check_heads",
    "check_tensor_parallel",
    "column_parallel_linear",
    "dtensor_loss_backward",
    "dtensor_param_groups",
    "dtensor_parallelize_gpt",
    "enter_region",
    "enter_region_on_input",
    "leave_region",
    "matmul_reduce_scatter",
    "measure_async_tp",
    "measure_tp_backward_overlap",
    "padded_vocab_size",
    "parallelize_attention",
    "parallelize_block",
    "parallelize_mlp",
    "parallelize_gpt",
    "partial_grad_parameters",
    "tensor_parallel_check",
    "tp_overlap_figures",
    "vocab_parallel_cross_entropy",
]
