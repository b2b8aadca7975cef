"""A plain ``state_dict()`` — model and optimizer — saved and loaded as it is, as DCP accepts one.

::

    save(root, step, {"model": model.state_dict(), "optim": opt.state_dict()})

    sd = {"model": fresh.state_dict(), "optim": fresh_opt.state_dict()}
    load(root, sd)                      # fills sd in place, adds the optimizer state it lacked
    fresh.load_state_dict(sd["model"])  # (the model's tensors were already filled in place)
    fresh_opt.load_state_dict(sd["optim"])

Nested dicts are walked and each leaf gets the name of its key path joined by ``/``
(``model/blocks.0.attn.qkv.weight``, ``optim/state/3/exp_avg``), the names a
:class:`~.state.ShardedState` uses, so the leaves become pieces:

* a :class:`~.state.Local` leaf is used as it is (sharded pieces may sit beside plain ones);
* a plain tensor is **replicated**: each rank's copy of the whole tensor, written once — rank
  0's copy under the default ``writers="lowest"``; ``writers="balanced"`` spreads the tensors
  over the ranks by planned size as DCP's default planner does (:mod:`~.dedup`). Every rank is
  trusted to hold the same values — DDP replicas and their optimizer state do — and nothing
  compares them (that would cost every rank a pass over every byte on each save). A rank whose
  plain tensor differs, such as a shard passed as if it were whole, is not saved: pass shards as
  :class:`~.state.Local` pieces (:func:`~.state.fsdp_state`, :func:`~.state.tensor_parallel_state`).
  A ``DTensor`` (FSDP2, torch tensor parallel) is refused for the same reason;
* anything else (``param_groups``: learning rate, betas; a ``None`` momentum buffer) stays in a
  copy of the dict structure, with each tensor replaced by its name. Rank 0 pickles that structure
  into its rank file as one more CRC-checked piece; ``metadata.json`` points at it as ``objects``.

On load every tensor of the target is filled in place. A tensor the checkpoint holds but the
target lacks is created, and the other values are restored from the saved structure (a fresh
optimizer's ``state_dict()`` has an empty ``state``; this is how it gets its ``exp_avg``) — except
under ``model/``: a model that lacks a saved parameter has the wrong configuration, and load
refuses it. Nothing is written into the target until every piece has passed its CRC-32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from dtlab.checkpoint.slices import whole
from dtlab.checkpoint.state import Local, ShardedState
from dtlab.checkpoint.storage import dtype_named

OBJECTS = "__objects__"  # the piece holding the pickled structure (rank 0's file)


@dataclass(frozen=True)
class SavedTensor:
    """Where a tensor sat in a saved plain state dict: the name of its pieces."""

    name: str


def flatten(state: Mapping) -> tuple[ShardedState, dict | None]:
    """The pieces of ``state`` and, when it holds anything but :class:`Local` pieces, its
    structure (tensors replaced by :class:`SavedTensor`) for rank 0 to pickle."""
    pieces: ShardedState = {}
    plain = False

    def walk(node: Mapping, prefix: str) -> dict:
        nonlocal plain
        out = {}
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                out[key] = walk(value, f"{name}/")
                continue
            if isinstance(value, Local):
                local = value
            elif torch.is_tensor(value):
                local, plain = _replicated(name, value), True
            else:
                out[key], plain = value, True
                continue
            if name in pieces:
                raise ValueError(f"two entries of the state are both named {name!r}; rename one")
            pieces[name] = local
            out[key] = SavedTensor(name)
        return out

    structure = walk(state, "")
    return pieces, (structure if plain else None)


def _replicated(name: str, tensor: torch.Tensor) -> Local:
    if type(tensor) is not torch.Tensor and type(tensor).__name__ == "DTensor":
        raise TypeError(
            f"{name!r} is a DTensor: a plain tensor is saved as replicated (rank 0's copy), "
            "which would lose the other ranks' shards; pass .full_tensor(), or the shards as "
            "dtlab.checkpoint.Local pieces"
        )
    return Local(tensor.detach(), whole(tensor.shape), True)


def leaves(structure: Mapping, path: tuple = ()):
    """``(key path, leaf)`` for every leaf of a saved structure."""
    for key, value in structure.items():
        if isinstance(value, Mapping):
            yield from leaves(value, (*path, key))
        else:
            yield (*path, key), value


def load_targets(
    state: Mapping, metadata: dict, read_structure: Callable[[], dict | None]
) -> tuple[ShardedState, Callable[[], None]]:
    """The pieces to fill for ``state``, and what to run once they are all verified and filled:
    put the created tensors and the saved non-tensor values into ``state`` (module doc).
    ``read_structure`` reads the saved structure (None if the checkpoint has none); it is called
    only for a plain target."""
    pieces, plain = flatten(state)
    additions: list[tuple[tuple, object]] = []
    structure = read_structure() if plain is not None else None
    if structure is not None:
        for path, leaf in leaves(structure):
            if not isinstance(leaf, SavedTensor):
                additions.append((path, leaf))
            elif leaf.name not in pieces and not leaf.name.startswith("model/"):
                stored = metadata["tensors"][leaf.name]
                shape = tuple(stored["global_shape"])
                new = torch.empty(shape, dtype=dtype_named(stored["dtype"]))
                pieces[leaf.name] = Local(new, whole(shape), True)
                additions.append((path, new))

    def put() -> None:
        for path, value in additions:
            node = state
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value

    return pieces, put
