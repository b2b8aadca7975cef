"""One rank's shard file: raw tensor bytes end to end, each piece with its own CRC-32.

A rank file is nothing but bytes; what they mean lives in the checkpoint's metadata (see
:mod:`dtlab.checkpoint.metadata`): for each piece the tensor name, its :class:`~.slices.Box`,
dtype, byte offset and length in the file, and a CRC-32 of those bytes. A reader therefore
``seek``s to exactly the pieces it needs and reads nothing else, and every piece it reads is
verified: a truncated file, a flipped bit or a piece of the wrong size is an error that names
the file and the tensor, never a silently wrong weight.
"""

from __future__ import annotations

import io
import os
import zlib
from pathlib import Path

import torch

from dtlab.files import write_all


def dtype_named(name: str) -> torch.dtype:
    """``"torch.bfloat16"`` -> ``torch.bfloat16`` (the dtype's ``str`` as stored in metadata)."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in checkpoint metadata")
    return dtype


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or does not fit; the message names file and tensor."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """No (complete) checkpoint where one was asked for: a missing or empty directory, or no
    checkpoint of the requested step. Both a :class:`CheckpointError` and a
    :class:`FileNotFoundError`, so ``except FileNotFoundError`` (what a missing file raises
    elsewhere) catches it too; the message names the directory."""


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw little-endian bytes of ``t`` (any dtype, bfloat16 included), row-major."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(data: bytes, dtype: str, shape) -> torch.Tensor:
    """The tensor whose :func:`tensor_bytes` are ``data``."""
    if not data:
        return torch.empty(tuple(shape), dtype=dtype_named(dtype))
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(dtype_named(dtype)).reshape(tuple(shape))


def write_pieces(path: Path, pieces: list[tuple[str, torch.Tensor]]) -> list[dict]:
    """Write ``(name, tensor)`` pieces end to end into a new file, ``fsync`` it, and return one
    entry per piece: ``name, offset, nbytes, crc32, dtype, shape`` (what the metadata stores)."""
    entries, offset = [], 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for name, tensor in pieces:
            data = tensor_bytes(tensor)
            write_all(fd, data)
            entries.append(
                {
                    "name": name,
                    "offset": offset,
                    "nbytes": len(data),
                    "crc32": zlib.crc32(data),
                    "dtype": str(tensor.dtype),
                    "shape": list(tensor.shape),
                }
            )
            offset += len(data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return entries


def read_piece(path: Path, entry: dict) -> torch.Tensor:
    """Read and verify one piece; :class:`CheckpointError` names the file and tensor on failure."""
    if not path.exists():
        raise CheckpointError(
            f"{path} is missing: it holds {entry['name']!r}; the checkpoint is incomplete — load "
            "an older one (checkpoints.complete_checkpoints(root))"
        )
    with open(path, "rb") as f:
        f.seek(entry["offset"])
        data = f.read(entry["nbytes"])
    if len(data) != entry["nbytes"]:
        raise CheckpointError(
            f"{path} is truncated: tensor {entry['name']!r} needs bytes {entry['offset']}.."
            f"{entry['offset'] + entry['nbytes']} but the file has {path.stat().st_size}"
        )
    if zlib.crc32(data) != entry["crc32"]:
        raise CheckpointError(
            f"{path} is corrupted: tensor {entry['name']!r} (bytes {entry['offset']}.."
            f"{entry['offset'] + entry['nbytes']}) fails its CRC-32 check"
        )
    return tensor_from_bytes(data, entry["dtype"], entry["shape"])


def pickled(obj) -> torch.Tensor:
    """Any picklable object (RNG states, data-loader position) as a uint8 tensor piece."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def unpickled(t: torch.Tensor):
    return torch.load(io.BytesIO(tensor_bytes(t)), weights_only=False)
