"""Imports every rank needs sooner or later, done once in the forkserver so each fork inherits them.

``torch.optim``'s step imports ``torch._dynamo`` the first time it runs
(``torch/optim/optimizer.py``, ``_use_grad_for_differentiable``): about 0.9 s of CPU per rank, paid
again by every rank of every new Cluster — 14 s of CPU for a 16-rank lab cell on 2 cores. Imported
here, a rank's first step costs what its later ones do.

``torch._dynamo`` is a private module: if importing it fails on some torch version, with any
error, nothing is preloaded and a rank imports it itself on its first step, as before
(multiprocessing's own preload would skip only an ``ImportError`` and let any other error stop
the forkserver).
"""

import contextlib

with contextlib.suppress(Exception):
    import torch._dynamo  # noqa: F401
