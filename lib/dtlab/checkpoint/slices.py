"""Which slice of a global tensor a piece holds, and copying the overlap of two pieces.

A *piece* is a box of a global tensor: ``offsets`` and ``lengths`` per dimension of a *view* of
it. The view is the tensor's own shape for tensor-parallel shards (rows or columns of a matrix),
or its row-major flattening ``(numel,)`` for FSDP shards, which cut a parameter's flat storage
at arbitrary element boundaries (Zhao et al., "PyTorch FSDP", VLDB 2023). Because both views
number the elements the same way (row-major), any stored piece can fill any wanted piece: an
element with flat index ``g`` sits in a box at ``unravel(g) - offsets`` when that lies inside.
This is the idea of torch.distributed.checkpoint's ``ChunkStorageMetadata`` (offsets, sizes),
generalised to flat chunks so one checkpoint loads into FSDP at any degree and into TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Box:
    """Elements ``offsets[d] .. offsets[d]+lengths[d]`` of ``global_shape`` (``flat``: of its
    row-major flattening, then ``offsets``/``lengths`` have one entry)."""

    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    flat: bool = False

    def __post_init__(self) -> None:
        view = self.view_shape
        if len(self.offsets) != len(view) or len(self.lengths) != len(view):
            raise ValueError(
                f"box offsets {self.offsets} / lengths {self.lengths} need one entry per "
                f"dimension of {view}"
            )
        for o, n, size in zip(self.offsets, self.lengths, view, strict=True):
            if o < 0 or n < 0 or o + n > size:
                raise ValueError(f"box {self.offsets}+{self.lengths} lies outside {view}")

    @property
    def view_shape(self) -> tuple[int, ...]:
        return (math.prod(self.global_shape),) if self.flat else tuple(self.global_shape)

    @property
    def numel(self) -> int:
        return math.prod(self.lengths)

    def as_json(self) -> dict:
        return {
            "offsets": list(self.offsets),
            "lengths": list(self.lengths),
            "flat": self.flat,
        }

    @classmethod
    def from_json(cls, global_shape, d: dict) -> Box:
        return cls(tuple(global_shape), tuple(d["offsets"]), tuple(d["lengths"]), d["flat"])


def whole(shape) -> Box:
    """The box covering all of a tensor of ``shape``."""
    shape = tuple(shape)
    return Box(shape, (0,) * len(shape), shape)


def flat_range(shape, start: int, stop: int) -> Box:
    """Elements ``start .. stop`` of the row-major flattening of a tensor of ``shape``."""
    return Box(tuple(shape), (start,), (stop - start,), flat=True)


def split_along(shape, dim: int, index: int, count: int) -> Box:
    """Part ``index`` of ``count`` equal parts of dimension ``dim`` (a tensor-parallel shard)."""
    shape = tuple(shape)
    if shape[dim] % count:
        raise ValueError(f"dimension {dim} of {shape} does not split into {count} equal parts")
    part = shape[dim] // count
    offsets = tuple(index * part if d == dim else 0 for d in range(len(shape)))
    lengths = tuple(part if d == dim else n for d, n in enumerate(shape))
    return Box(shape, offsets, lengths)


def flat_indices(box: Box) -> torch.Tensor:
    """The global row-major index of every element of ``box``, in the box's own order."""
    view = box.view_shape
    index = torch.zeros((), dtype=torch.long)
    for d, (o, n) in enumerate(zip(box.offsets, box.lengths, strict=True)):
        stride = math.prod(view[d + 1 :])
        coord = torch.arange(o, o + n, dtype=torch.long) * stride
        index = index.unsqueeze(-1) + coord
    return index.reshape(-1)


def positions_in(box: Box, global_index: torch.Tensor) -> torch.Tensor:
    """Where each global flat index sits in ``box`` (its row-major position), or -1 if outside."""
    view = box.view_shape
    rest = global_index.clone()
    pos = torch.zeros_like(global_index)
    inside = torch.ones_like(global_index, dtype=torch.bool)
    for d in range(len(view)):
        stride = math.prod(view[d + 1 :])
        coord = rest // stride - box.offsets[d]
        rest = rest % stride
        inside &= (coord >= 0) & (coord < box.lengths[d])
        pos = pos * box.lengths[d] + coord
    return torch.where(inside, pos, torch.full_like(pos, -1))


def overlaps(a: Box, b: Box) -> bool:
    """Whether two boxes of the same tensor share an element (cheap check, then exact)."""
    if a.flat == b.flat:
        return all(
            max(oa, ob) < min(oa + na, ob + nb)
            for oa, na, ob, nb in zip(a.offsets, a.lengths, b.offsets, b.lengths, strict=True)
        )
    return bool((positions_in(b, flat_indices(a)) >= 0).any())


def copy_overlap(dest: torch.Tensor, dest_box: Box, src: torch.Tensor, src_box: Box) -> int:
    """Copy the elements ``src`` (holding ``src_box``) shares with ``dest`` (holding ``dest_box``)
    into ``dest``; return how many were copied."""
    if tuple(dest_box.global_shape) != tuple(src_box.global_shape):
        raise ValueError(
            f"global shapes differ: stored {tuple(src_box.global_shape)}, "
            f"wanted {tuple(dest_box.global_shape)}"
        )
    if dest_box == src_box:  # the same slice: one copy (the common case: same layout)
        dest.copy_(src.reshape(dest.shape))
        return dest_box.numel
    if dest_box.flat == src_box.flat and dest_box.flat:
        lo = max(dest_box.offsets[0], src_box.offsets[0])
        hi = min(dest_box.offsets[0] + dest_box.lengths[0], src_box.offsets[0] + src_box.lengths[0])
        if hi <= lo:
            return 0
        d0, s0 = lo - dest_box.offsets[0], lo - src_box.offsets[0]
        dest.view(-1)[d0 : d0 + hi - lo] = src.reshape(-1)[s0 : s0 + hi - lo].to(dest)
        return hi - lo
    where = positions_in(src_box, flat_indices(dest_box))
    hit = where >= 0
    count = int(hit.sum())
    if count:
        dest.view(-1)[hit.to(dest.device)] = src.reshape(-1)[where[hit]].to(dest)
    return count
