"""Shared fixtures: warm gloo clusters reused across the whole test session.

Starting ranks costs about a second; a session-scoped cluster per world size keeps the suite lean.
A test that breaks its cluster on purpose (hang, crash) must use its own ``Cluster``.

Tests marked ``gpu`` (``pytest -m gpu`` selects them) are skipped on a machine without CUDA, so
the default run reports them as skipped — never as passed — even if a file forgets its own skip.
"""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("DTLAB_MODE", "fast")
# Graded cells record attempts under ~/.dtlab. Tests and the notebook kernels nbval starts (they
# inherit this environment) must never write into the real learner's home, so give them their own.
os.environ["HOME"] = tempfile.mkdtemp(prefix="dtlab-test-home-")

import torch  # noqa: E402

from dtlab import Cluster  # noqa: E402

pytest_plugins = ["pytester"]  # test_runtime_gpu_marker runs a small inner pytest

# The test process computes single-process references while rank processes run beside it on the
# same cores; one intra-op thread each avoids oversubscribing a small machine.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def _make_cluster(world_size: int):
    cluster = Cluster(world_size, device="cpu", timeout=120.0)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def cluster1():
    yield from _make_cluster(1)


@pytest.fixture(scope="session")
def cluster2():
    yield from _make_cluster(2)


@pytest.fixture(scope="session")
def cluster3():
    yield from _make_cluster(3)


@pytest.fixture(scope="session")
def cluster4():
    yield from _make_cluster(4)
