"""The CPU peak of a piece of work, read from the profiler's allocation events, is exact."""

from __future__ import annotations

import torch

from dtlab.memory import peak_bytes_of

MB4 = 1000 * 1000 * 4  # one 1000×1000 fp32 matrix


def test_peak_counts_tensors_alive_together_and_ignores_older_ones():
    x = torch.randn(1000, 1000)  # allocated before the work: not part of its peak

    def work():
        a = x @ x  # +4 MB
        b = a.relu()  # +4 MB: a and b alive together -> 8 MB peak
        del a  # -4 MB
        c = b.neg()  # +4 MB: back to 8 MB, not 12 (no Python scalars: each is a tiny tensor)
        return c

    result = peak_bytes_of(work)
    assert result.peak_bytes == 2 * MB4
    assert result.source == "cpu profiler"


def test_work_that_frees_everything_ends_at_zero():
    def work():
        t = torch.ones(256, 256)
        u = t.neg()
        del t, u

    result = peak_bytes_of(work)
    assert result.peak_bytes == 2 * 256 * 256 * 4
    assert result.end_bytes == 0
