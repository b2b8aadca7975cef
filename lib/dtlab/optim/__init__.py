"""Optimizers whose update is not elementwise, and what that costs when the state is sharded.

* :mod:`~dtlab.optim.muon` — Muon (momentum orthogonalised by Newton–Schulz) under ZeRO: every
  rank gathers and orthogonalises every matrix, or each matrix has one owner that gathers,
  orthogonalises and scatters it back; equal updates, counted bytes and FLOPs.
"""

from dtlab.optim.muon import (
    STRATEGIES,
    muon_bytes_per_rank,
    muon_flops_per_rank,
    muon_update,
    newton_schulz,
    newton_schulz_flops,
    plan_owners,
    sharded_muon_updates,
)

__all__ = [
    "STRATEGIES",
    "muon_bytes_per_rank",
    "muon_flops_per_rank",
    "muon_update",
    "newton_schulz",
    "newton_schulz_flops",
    "plan_owners",
    "sharded_muon_updates",
]
