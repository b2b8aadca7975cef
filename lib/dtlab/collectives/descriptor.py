"""What one rank asked a collective to do, as numbers every rank can compare: the call descriptor.

:class:`CallDescriptor` holds the fields every rank of a collective must agree on. It travels
as ``8 + 2N`` int64 (``N`` ranks): which collective, algorithm, dtype, element count, root,
reduce op, one more number (``detail``), a spare zero, then two lists of ``N`` per-rank counts
(``-1`` each where a call has none). Words (collective, algorithm, op) and dtypes are indices
into fixed tables that only grow at the end, so every rank of a job — all running the same
torch — encodes alike. :func:`digest` hashes that row to a 62-bit BLAKE2b number, cached per
distinct call signature.

It stands alone because it is the data, not the check: how a call is written down and hashed
knows nothing of ranks or messages. :mod:`~dtlab.collectives.agreement` exchanges the digests
and descriptors and re-exports :class:`CallDescriptor` and :func:`digest`.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache

import torch

_WORDS = (
    "",
    *("all_reduce", "broadcast", "reduce", "reduce_scatter", "all_gather", "all_to_all"),
    *("gather", "scatter", "hierarchical_all_reduce"),
    *("naive", "ring", "recursive_doubling", "rabenseifner", "binary_tree"),
    *("flat", "binomial", "chain", "pairwise"),
    *("sum", "avg", "max", "min"),
    *("double_binary_tree", "recursive_halving", "auto"),
    *("one_shot", "two_shot", "in_network"),
    "ring_shm",
)
_DTYPES = tuple(
    getattr(torch, name)
    for name in (
        *("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8"),
        *("uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"),
        *("uint16", "uint32", "uint64", "complex32", "float8_e4m3fnuz", "float8_e5m2fnuz"),
        *("float8_e8m0fnu", "float4_e2m1fn_x2"),
    )
    if hasattr(torch, name)
)  # appended only: every rank of a job runs the same torch, so the indices agree
_HEADER = 8


@dataclass(frozen=True)
class CallDescriptor:
    """What one rank asked a collective to do (the fields that every rank must agree on)."""

    collective: str
    algorithm: str = ""
    dtype: torch.dtype | None = None
    numel: int = 0
    root: int = -1
    op: str = ""
    detail: int = 0  # all-to-all: elements per row; hierarchical: ranks per node; auto: link
    counts: tuple[int, ...] | None = None  # all-gather: sizes; all-to-all: send_splits
    more_counts: tuple[int, ...] | None = None  # all-to-all: recv_splits


def _dtype_code(dtype: torch.dtype | None) -> int:
    """An index into ``_DTYPES``; a dtype not listed gets ``1000 +`` a CRC of its name, so two
    unlisted dtypes of the same size still disagree (they would move the same bytes and
    reinterpret them silently)."""
    if dtype is None:
        return -1
    if dtype in _DTYPES:
        return _DTYPES.index(dtype)
    return 1000 + zlib.crc32(str(dtype).encode())


def _dtype_of(code: int) -> torch.dtype | str | None:
    if code < 0:
        return None
    return _DTYPES[code] if code < 1000 else f"an unlisted dtype (code {code})"


def _encode(call: CallDescriptor, n: int) -> list[int]:
    def counts(values: tuple[int, ...] | None) -> list[int]:
        return [-1] * n if values is None else list(values)

    return [
        _WORDS.index(call.collective),
        _WORDS.index(call.algorithm),
        _dtype_code(call.dtype),
        call.numel,
        call.root,
        _WORDS.index(call.op),
        call.detail,
        0,
        *counts(call.counts),
        *counts(call.more_counts),
    ]


def _decode(row: list[int], n: int) -> CallDescriptor:
    def counts(values: list[int]) -> tuple[int, ...] | None:
        return None if values and values[0] < 0 else tuple(values)

    return CallDescriptor(
        _WORDS[row[0]],
        _WORDS[row[1]],
        _dtype_of(row[2]),
        row[3],
        row[4],
        _WORDS[row[5]],
        row[6],
        counts(row[_HEADER : _HEADER + n]),
        counts(row[_HEADER + n :]),
    )


@lru_cache(maxsize=256)
def digest(call: CallDescriptor, n: int) -> int:
    """A 62-bit BLAKE2b digest of ``call``'s descriptor in an ``n``-rank group (≥ 0; cached per
    distinct call signature, so a training loop's repeated calls hash nothing)."""
    row = _encode(call, n)
    packed = struct.pack(f"<{len(row)}q", *row)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little") >> 2
