"""The ``gpu`` marker: ``pytest -m gpu`` selects GPU tests; without CUDA they are skipped."""

from __future__ import annotations

from pathlib import Path

import torch

GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_needs_a_gpu():
    pass  # no skipif of its own: the shared conftest must still keep it from passing on a CPU

def test_runs_anywhere():
    pass
"""


def test_gpu_marked_tests_are_selected_by_marker_and_never_pass_without_cuda(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a CUDA GPU\n")
    pytester.makepyfile(test_marked=GPU_TEST)
    everything = pytester.runpytest("-p", "no:cacheprovider")
    selected = pytester.runpytest("-p", "no:cacheprovider", "-m", "gpu")
    if torch.cuda.is_available():
        everything.assert_outcomes(passed=2)
        selected.assert_outcomes(passed=1, deselected=1)
    else:
        everything.assert_outcomes(passed=1, skipped=1)
        selected.assert_outcomes(skipped=1, deselected=1)
