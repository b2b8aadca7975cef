"""``metadata.json``: the checkpoint's table of contents, sealed by a CRC-32 of its own bytes.

The rank files carry a CRC-32 per piece (:mod:`~.storage`), but the metadata says where those
pieces are, what step was saved and on how many ranks (``world_size``: a resume restores RNG
states only when it equals its own world size, so a flipped bit there breaks bit-for-bit resume
without touching a tensor). It is sealed the same way. The file is written as exactly::

    {"crc32": "<8 lowercase hex digits>", "metadata": <body>}

where ``<body>`` is ``json.dumps`` of the metadata and the CRC-32 is of the body's bytes. A reader
checks the envelope byte for byte and the CRC against the body, so **every single-bit flip
anywhere in the file is an error**: one in the body changes its CRC-32 (a CRC detects every
single-bit error, and every burst up to 32 bits); one in a hex digit of the stored CRC gives
either a character that is not a lowercase hex digit or a different value; one in the fixed
text of the envelope breaks the byte-for-byte match. ``tests/test_checkpoint_units.py`` flips
every bit of a real checkpoint's metadata and loads it.

Checkpoints written before the seal (``"format": 1``, the bare body) still load, so upgrading
dtlab loses nothing already saved: the file must then be exactly ``json.dumps`` of what it
parses to, with the format-1 keys. That catches a flip that breaks the JSON or its spacing but
not one that changes a number — unsealed metadata cannot be fully checked; save again to seal it.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

from dtlab.checkpoint.storage import CheckpointError

NAME = "metadata.json"
FORMAT = 2  # 1: bare JSON body (no CRC); 2: the sealed envelope above
_SEALED = re.compile(rb'\A\{"crc32": "([0-9a-f]{8})", "metadata": (\{.*\})\}\Z', re.DOTALL)
_FORMAT_1_KEYS = {"format", "step", "world_size", "tensors", "extras"}


def sealed(metadata: dict) -> bytes:
    """The bytes of ``metadata.json`` for ``metadata``: the body and a CRC-32 of it."""
    body = json.dumps({**metadata, "format": FORMAT}).encode("ascii")
    return b'{"crc32": "%08x", "metadata": %s}' % (zlib.crc32(body), body)


def unsealed(data: bytes, path: Path) -> dict:
    """The metadata in ``data`` (read from ``path``), or :class:`CheckpointError` naming it."""
    match = _SEALED.match(data)
    if match is not None:
        stored, body = match.groups()
        if int(stored, 16) != zlib.crc32(body):
            raise CheckpointError(
                f"{path} is corrupted: its body fails its CRC-32 check (stored {stored.decode()}, "
                f"computed {zlib.crc32(body):08x}); load an older checkpoint "
                "(dtlab.checkpoint.complete_checkpoints(root))"
            )
        meta = _parsed(body, path)
        if meta.get("format") == FORMAT:
            return meta
        raise CheckpointError(f"{path} has format {meta.get('format')!r}; this dtlab reads 2")
    meta = _parsed(data, path)  # not sealed: a format-1 checkpoint, or a corrupted seal
    if (
        isinstance(meta, dict)
        and set(meta) == _FORMAT_1_KEYS
        and meta["format"] == 1
        and json.dumps(meta).encode("ascii") == data
    ):
        return meta
    raise CheckpointError(
        f"{path} is corrupted: it is neither a sealed metadata file "
        '({"crc32": ..., "metadata": ...}) nor an unsealed one written by an older dtlab; load an '
        "older checkpoint (dtlab.checkpoint.complete_checkpoints(root))"
    )


def _parsed(data: bytes, path: Path):
    try:
        return json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise CheckpointError(f"{path} is corrupted: not valid JSON ({exc})") from exc


def read_metadata(folder: str | Path) -> dict:
    """The verified metadata of the checkpoint in ``folder`` (a ``step_*`` directory)."""
    path = Path(folder) / NAME
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from exc
    return unsealed(data, path)
