"""A small model of PyTorch's CUDA caching allocator: reserved vs allocated, and fragmentation.

PyTorch does not return freed GPU memory to the driver: it keeps the block in a pool and reuses
it for a later request (``c10/cuda/CUDACachingAllocator.cpp``). So ``memory_reserved()`` (what
the allocator holds from the driver) is at least ``memory_allocated()`` (live tensors), and the
difference is cache. The rules modelled here, simplified from the real allocator:

* sizes round up to 512 B;
* a request is served from the **best-fitting free block** of the pool (the smallest one that
  is large enough), which is **split** when more than 1 MiB would be left over;
* with no such block, a new **segment** is reserved from the driver: 2 MiB for requests up to
  1 MiB, 20 MiB up to 10 MiB, otherwise the request rounded up to 2 MiB;
* a freed block merges with free neighbours **in the same segment** only, so free memory spread
  over several segments cannot serve one large request: **fragmentation**. When reserving a new
  segment would exceed the device, the allocator first releases fully free segments and retries;
  if still too big, it is out of memory although ``reserved − allocated`` may be large.

``expandable_segments=True`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) models the
alternative: one segment per pool in a large virtual range, grown page by page (2 MiB) at its
end, so free space next to the end is extended instead of stranded in a separate segment.

This is a teaching model for sizes and ordering, not a replica: the real allocator also has a
small pool, per-stream pools, garbage collection thresholds and more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1 << 20
PAGE = 2 * MiB


def _round(n: int, to: int) -> int:
    return -(-n // to) * to


def segment_size(nbytes: int) -> int:
    """Bytes reserved from the driver for a request that no cached block can serve."""
    if nbytes <= MiB:
        return PAGE
    if nbytes <= 10 * MiB:
        return 20 * MiB
    return _round(nbytes, PAGE)


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True


@dataclass
class CachingAllocator:
    """``capacity`` bytes of device memory; ``malloc`` returns a handle, ``free`` takes it back."""

    capacity: int
    expandable_segments: bool = False
    blocks: list[_Block] = field(default_factory=list)
    segments: dict[int, int] = field(default_factory=dict)  # segment id -> reserved bytes
    live: dict[int, _Block] = field(default_factory=dict)
    _next_handle: int = 0

    @property
    def allocated(self) -> int:
        return sum(b.size for b in self.blocks if not b.free)

    @property
    def reserved(self) -> int:
        return sum(self.segments.values())

    @property
    def largest_free_block(self) -> int:
        return max((b.size for b in self.blocks if b.free), default=0)

    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes``; raises ``MemoryError`` like an OOM, naming reserved and allocated."""
        if nbytes <= 0:
            raise ValueError(f"allocation of {nbytes} bytes: sizes must be > 0")
        size = _round(nbytes, 512)
        block = self._best_fit(size) or self._grow(size)
        if block is None:
            self._release_free_segments()
            block = self._best_fit(size) or self._grow(size)
        if block is None:
            raise MemoryError(
                f"tried to allocate {size / MiB:.1f} MiB: {self.allocated / MiB:.1f} MiB allocated, "
                f"{(self.reserved - self.allocated) / MiB:.1f} MiB reserved but unallocated, "
                f"largest free block {self.largest_free_block / MiB:.1f} MiB, capacity "
                f"{self.capacity / MiB:.1f} MiB"
            )
        if block.size - size > MiB:  # split, keep the remainder in the pool
            rest = _Block(block.segment, block.offset + size, block.size - size)
            self.blocks.insert(self.blocks.index(block) + 1, rest)
            block.size = size
        block.free = False
        self._next_handle += 1
        self.live[self._next_handle] = block
        return self._next_handle

    def free(self, handle: int) -> None:
        """Return a block to the pool and merge it with free neighbours in its segment."""
        block = self.live.pop(handle)
        block.free = True
        i = self.blocks.index(block)
        if i + 1 < len(self.blocks) and self._mergeable(block, self.blocks[i + 1]):
            block.size += self.blocks.pop(i + 1).size
        if i > 0 and self._mergeable(self.blocks[i - 1], block):
            self.blocks[i - 1].size += self.blocks.pop(i).size

    @staticmethod
    def _mergeable(left: _Block, right: _Block) -> bool:
        return (
            left.free and right.free and left.segment == right.segment
            and left.offset + left.size == right.offset
        )  # fmt: skip

    def _best_fit(self, size: int) -> _Block | None:
        fits = [b for b in self.blocks if b.free and b.size >= size]
        return min(fits, key=lambda b: b.size, default=None)

    def _grow(self, size: int) -> _Block | None:
        if self.expandable_segments and self.segments:
            seg = 0
            tail = self.blocks[-1]
            have = tail.size if tail.free else 0
            extra = _round(size - have, PAGE)
            if self.reserved + extra > self.capacity:
                return None
            self.segments[seg] += extra
            if tail.free:
                tail.size += extra
                return tail
            block = _Block(seg, tail.offset + tail.size, extra)
            self.blocks.append(block)
            return block
        want = _round(size, PAGE) if self.expandable_segments else segment_size(size)
        if self.reserved + want > self.capacity:
            return None
        seg = 0 if self.expandable_segments else (max(self.segments, default=-1) + 1)
        self.segments[seg] = want
        block = _Block(seg, 0, want)
        self.blocks.append(block)
        return block

    def _release_free_segments(self) -> None:
        """What the allocator does before reporting OOM: give fully free segments back."""
        for seg in list(self.segments):
            mine = [b for b in self.blocks if b.segment == seg]
            if all(b.free for b in mine):
                self.blocks = [b for b in self.blocks if b.segment != seg]
                del self.segments[seg]


def segment_layout(alloc: CachingAllocator) -> list[list[tuple[int, bool]]]:
    """Each segment's blocks in address order as ``(bytes, in_use)``: what a memory snapshot's
    ``segments`` list shows, for the same chart."""
    layout: dict[int, list[tuple[int, int, bool]]] = {seg: [] for seg in alloc.segments}
    for b in alloc.blocks:
        layout[b.segment].append((b.offset, b.size, not b.free))
    return [[(size, used) for _, size, used in sorted(layout[seg])] for seg in sorted(layout)]


def replay(
    events: list[tuple], capacity: int, expandable_segments: bool = False
) -> tuple[CachingAllocator, dict]:
    """Feed an allocation trace — ``("alloc", id, nbytes)`` and ``("free", id)`` in order — to
    a fresh allocator; return it and, in bytes, ``peak_allocated`` (the most ever in use),
    ``peak_reserved`` (the most ever held from the device) and ``overhead`` — their difference:
    what caching and fragmentation cost beyond what the program needed at its peak — and
    ``layout_at_peak``, the :func:`segment_layout` at the moment the most was in use.

    An allocation the model cannot place raises ``MemoryError`` as the real allocator would."""
    alloc = CachingAllocator(capacity, expandable_segments)
    handles: dict = {}
    peaks: dict = {"peak_allocated": 0, "peak_reserved": 0, "layout_at_peak": []}
    for event in events:
        if event[0] == "alloc":
            handles[event[1]] = alloc.malloc(event[2])
        elif event[0] == "free":
            if event[1] in handles:
                alloc.free(handles.pop(event[1]))
        else:
            raise ValueError(f"event {event!r}: the kind must be 'alloc' or 'free'")
        if alloc.allocated > peaks["peak_allocated"]:
            peaks["peak_allocated"] = alloc.allocated
            peaks["layout_at_peak"] = segment_layout(alloc)
        peaks["peak_reserved"] = max(peaks["peak_reserved"], alloc.reserved)
    peaks["overhead"] = peaks["peak_reserved"] - peaks["peak_allocated"]
    return alloc, peaks


def fragmentation_demo_trace(steps: int = 6) -> list[tuple]:
    """:func:`fragmentation_demo`'s requests as an allocation trace, for :func:`replay`."""
    events: list[tuple] = []
    for step in range(steps):
        events += [("alloc", f"work{step}", 150 * MiB), ("free", f"work{step}"),
                   ("alloc", f"kept{step}", 100 * MiB)]  # fmt: skip
    return events


def fragmentation_demo(
    capacity_mib: int = 1024,
    expandable_segments: bool = False,
    steps: int = 6,
    request_mib: int = 200,
) -> dict:
    """A workspace freed and a smaller tensor kept, step after step; then one larger request.

    Each step allocates a 150 MiB workspace, frees it, then allocates a 100 MiB tensor that stays
    alive: the tensor is carved from the cached 150 MiB block, stranding 50 MiB beside it. The
    next step's workspace fits no stranded piece and reserves a new segment. The final request
    for ``request_mib`` then fails although the device has room, because the free memory is in
    pieces no larger than 50 MiB in segments that cannot merge — unless segments are expandable.
    """
    alloc = CachingAllocator(capacity_mib * MiB, expandable_segments)
    for _ in range(steps):
        alloc.free(alloc.malloc(150 * MiB))
        alloc.malloc(100 * MiB)
    state = {
        "allocated_mib": alloc.allocated / MiB,
        "reserved_mib": alloc.reserved / MiB,
        "cached_mib": (alloc.reserved - alloc.allocated) / MiB,
        "largest_free_mib": alloc.largest_free_block / MiB,
        "device_free_mib": capacity_mib - alloc.allocated / MiB,
    }
    try:
        alloc.malloc(request_mib * MiB)
        state["request_fits"] = True
    except MemoryError as error:
        state["request_fits"] = False
        state["error"] = str(error)
    return state
