"""Performance on one accelerator: the roofline, fusion, launch overhead, host syncs, memory.

Half of a distributed step's time is decided on one device. Each module measures one idea on
the machine it runs on (a CPU here, a GPU when there is one) and prints the formula beside it:

* :mod:`~dtlab.perf.roofline` — the two roofs (GEMM sweep, streaming copy) and an op's
  arithmetic intensity and bound from its shapes;
* :mod:`~dtlab.perf.op_census` — every op of a step with counted FLOPs and bytes (dispatch
  mode + ``FlopCounterMode``) and its profiled time, placed on the roofline;
* :mod:`~dtlab.perf.fusion` — RMSNorm eager vs fewer passes by hand vs ``torch.compile``,
  and a whole training step eager vs compiled;
* :mod:`~dtlab.perf.launch` — time per op as ops shrink, launch-bound steps, CUDA graphs;
* :mod:`~dtlab.perf.syncs` — every host–device sync a step makes, on the timeline;
  :mod:`~dtlab.perf.sample_trace` — a GPU profile with planted syncs to read;
* :mod:`~dtlab.perf.memory` — allocation traces, the caching allocator (real on a GPU,
  :mod:`dtlab.cost.caching_allocator` simulated on a CPU) and its fragmentation;
* :mod:`~dtlab.perf.workloads` — the lab-GPT step, with planted host syncs, with them fixed, and
  compiled;
  :mod:`~dtlab.perf.charts` — the lab's charts; :mod:`~dtlab.perf.dispatch` — the dispatcher
  hook the counters share.

The submodules import torch; import them directly (``from dtlab.perf.roofline import …``).
"""
