"""Progress bars for long work on the cluster, fed from the ranks without slowing them.

In a rank function (or anywhere else)::

    for step in dtlab.progress.track(range(steps), desc="training"):
        ...                                   # one bar on the notebook, not one per rank

What moves where:

* On a rank of a :class:`dtlab.Cluster`, :func:`track` / :func:`update` send
  ``("progress", call_id, (done, total, desc))`` up the rank's result pipe — from rank 0 only
  (ranks move in lock step; one reporter keeps the pipe quiet) and at most every
  :data:`MIN_INTERVAL_S` seconds (plus the final step), so a rank pays a clock read per step and
  a tiny pipe write five times a second. The driver's :class:`dtlab.runtime.watch.RunWatch`
  hands each message to :func:`driver_display`, which draws it.
* Outside a Cluster run (the notebook driver looping over ``cluster.run`` calls, a sweep, a
  script under ``torchrun`` on rank 0), the same calls draw a bar locally.
* The bar is ``tqdm.auto`` in a notebook (a widget), ``rich`` in a terminal, and nothing when
  output goes to a file or pipe. :func:`displaying` swaps in another display (tests use it).

Interrupting a run (Ctrl-C, or the kernel's stop button) closes the bar and, as before, kills
and restarts the ranks on the next ``run``: the cluster stays usable.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
MIN_INTERVAL_S = 0.2  # a rank sends at most this often (plus its last step)


class Display(Protocol):
    """What draws progress on the driver: ``update`` as often as messages come, ``close`` once."""

    def update(self, done: int, total: int | None, desc: str) -> None: ...

    def close(self) -> None: ...


# -- on a rank --------------------------------------------------------------------------------

_sender: Callable[[tuple], None] | None = None  # set by the worker for the length of one call
_reporting = True  # this rank reports (rank 0 does)
_send_lock = threading.Lock()


def bind_sender(sender: Callable[[tuple], None] | None, reporting: bool) -> None:
    """Called by the rank worker around each call: where progress goes, and whether this rank
    is the one that reports. ``None`` unbinds (then progress draws locally)."""
    global _sender, _reporting
    _sender, _reporting = sender, reporting


class _Reporter:
    def __init__(self, total: int | None, desc: str):
        self.total, self.desc, self.done = total, desc, 0
        self._last_sent, self._last_done = -float("inf"), -1
        self._local: Display | None = None
        if _sender is None and _reporting:
            try:
                self._local = _default_display()
            except Exception as error:  # e.g. tqdm missing: the loop runs, without a bar
                warnings.warn(f"dtlab.progress: no progress bar ({error})", stacklevel=3)

    def advance(self, done: int, force: bool = False) -> None:
        self.done = done
        now = time.monotonic()
        finished = self.total is not None and done >= self.total
        if done == self._last_done or (
            not (force or finished) and now - self._last_sent < MIN_INTERVAL_S
        ):
            return
        self._last_sent, self._last_done = now, done
        if _sender is not None:
            if _reporting:
                with _send_lock:
                    _sender((done, self.total, self.desc))
        elif self._local is not None:
            self._local.update(done, self.total, self.desc)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()


def track(iterable: Iterable[T], desc: str = "", total: int | None = None) -> Iterator[T]:
    """Yield from ``iterable``, reporting each step to one progress bar on the driver."""
    if total is None:
        with contextlib.suppress(TypeError):
            total = len(iterable)  # type: ignore[arg-type]
    reporter = _Reporter(total, desc)
    reporter.advance(0, force=True)
    try:
        for done, value in enumerate(iterable, start=1):
            yield value
            reporter.advance(done)
        reporter.advance(reporter.done, force=True)
    finally:
        reporter.close()


_last_update = [-float("inf")]


def update(done: int, total: int | None = None, desc: str = "") -> None:
    """Report ``done`` of ``total`` steps (for loops :func:`track` cannot wrap).

    Throttled like :func:`track` (the last step always goes); on a rank only the reporting rank
    sends; outside a Cluster run it does nothing (use :func:`track` for a local bar).
    """
    now = time.monotonic()
    last = total is not None and done >= total
    if _sender is None or not _reporting or (now - _last_update[0] < MIN_INTERVAL_S and not last):
        return
    _last_update[0] = now
    with _send_lock:
        _sender((done, total, desc))


# -- on the driver ----------------------------------------------------------------------------

_display_factory: Callable[[], Display | None] | None = None


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and "IPKernelApp" in shell.get_ipython().config  # type: ignore[union-attr]
    except Exception:
        return False


class _TqdmDisplay:
    def __init__(self):
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.bar = None

    def update(self, done: int, total: int | None, desc: str) -> None:
        if self.bar is None:
            self.bar = self._tqdm(total=total, desc=desc or "cluster", leave=True)
        if total is not None and self.bar.total != total:
            self.bar.total = total
        self.bar.set_description(desc or "cluster", refresh=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _RichDisplay:
    def __init__(self):
        from rich.progress import Progress

        self.progress = Progress(transient=False)
        self.task: Any = None

    def update(self, done: int, total: int | None, desc: str) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(desc or "cluster", total=total)
        self.progress.update(self.task, completed=done, total=total, description=desc or "cluster")

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()


def _default_display() -> Display | None:
    if _display_factory is not None:
        return _display_factory()
    if _in_notebook():
        return _TqdmDisplay()
    if sys.stderr is not None and sys.stderr.isatty():
        return _RichDisplay()
    return None


@contextlib.contextmanager
def displaying(factory: Callable[[], Display | None]):
    """Use ``factory()`` for every progress display made inside the ``with`` block."""
    global _display_factory
    previous, _display_factory = _display_factory, factory
    try:
        yield
    finally:
        _display_factory = previous


class driver_display:
    """One Cluster call's display: made at its first progress message, closed when the call ends
    (returns, raises or is interrupted)."""

    def __init__(self):
        self.display: Display | None = None
        self.started = False

    def __call__(self, rank: int, message: tuple) -> None:
        done, total, desc = message
        try:
            if not self.started:
                self.started = True
                self.display = _default_display()
            if self.display is not None:
                self.display.update(int(done), total, str(desc))
        except Exception as error:  # a bar must never break the run it reports on
            self.display = None
            warnings.warn(f"dtlab.progress: no progress bar ({error})", stacklevel=2)

    def close(self) -> None:
        if self.display is not None:
            with contextlib.suppress(Exception):
                self.display.close()
            self.display = None
