"""Export a Trace as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and
chrome://tracing open.

Format: the "JSON Object Format" of the Trace Event Format spec (Google, 2016): a dict with a
``traceEvents`` list. Each span is a complete event ``{"ph": "X", "ts": µs, "dur": µs}`` with
``pid`` = rank (one process row per rank, named "rank N" by a ``process_name`` metadata event)
and ``tid`` = one thread row per span kind (``tid = KINDS.index(kind)``: compute 0, comm 1, ...). The viewers draw events on one
thread as a stack, so they must nest; when two spans of one kind on one rank partly overlap
(two async all-reduces in flight), the later one moves to an extra row "comm #2".
"""

from __future__ import annotations

import json

from dtlab.trace.recorder import KINDS, Span


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def nesting_rows(spans: list[Span]) -> list[int]:
    """A row index per span (spans in start order) so that spans on one row nest or are apart."""
    open_ends_by_row: list[list[int]] = []  # per row: a stack of the ends of open spans
    rows = []
    for s in spans:
        for row, stack in enumerate(open_ends_by_row):
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            if not stack or s.end_ns <= stack[-1]:
                stack.append(s.end_ns)
                rows.append(row)
                break
        else:
            open_ends_by_row.append([s.end_ns])
            rows.append(len(open_ends_by_row) - 1)
    return rows


def chrome_trace_events(spans_by_rank: dict[int, list[Span]], origin_ns: int) -> dict:
    """Every rank's spans as a JSON-ready dict; times in microseconds after ``origin_ns``.

    Takes plain spans, not a ``Trace``: :class:`~dtlab.trace.analysis.Trace` uses this module,
    never the other way round.
    """
    events: list[dict] = []
    for rank, spans in spans_by_rank.items():
        events.append(_meta("process_name", rank, 0, {"name": f"rank {rank}"}))
        events.append(_meta("process_sort_index", rank, 0, {"sort_index": rank}))
        tids: dict[tuple[str, int], int] = {}
        for kind in sorted({s.kind for s in spans}, key=KINDS.index):
            of_kind = [s for s in spans if s.kind == kind]
            for s, row in zip(of_kind, nesting_rows(of_kind), strict=True):
                # Row 0 of a kind has the same tid on every rank; extra rows are numbered after.
                first_free = len(KINDS) + len(tids)
                tid = tids.setdefault((kind, row), KINDS.index(kind) if row == 0 else first_free)
                events.append(
                    {
                        "name": s.name,
                        "cat": s.kind,
                        "ph": "X",
                        "ts": (s.start_ns - origin_ns) / 1e3,
                        "dur": (s.end_ns - s.start_ns) / 1e3,
                        "pid": rank,
                        "tid": tid,
                        "args": {
                            "nbytes": s.nbytes,
                            **{k: _jsonable(v) for k, v in s.labels.items()},
                        },
                    }
                )
        for (kind, row), tid in tids.items():
            label = kind if row == 0 else f"{kind} #{row + 1}"
            events.append(_meta("thread_name", rank, tid, {"name": label}))
            events.append(_meta("thread_sort_index", rank, tid, {"sort_index": tid}))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
