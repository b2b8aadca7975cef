"""How a function and its arguments travel from the driver to the ranks, with their source lines.

``Cluster.run`` sends ``(fn, args, kwargs)`` to every rank. A function from a notebook cell or a
closure cannot be pickled by reference, so cloudpickle sends it by value: its code object
travels and is rebuilt on the rank. Hang reports and a failing exercise's "your line" then read
that rebuilt code's ``co_filename`` and line numbers to point at the learner's code.

How cloudpickle rebuilds a code object is its own choice, not a promise: 3.1.3 rewrites every
``co_filename`` to ``"<dynamic-code>"`` (to make payloads deterministic), which turned every
report into ``(<dynamic-code>:80)``. So dtlab does not leave code objects to it. Its pickler
(cloudpickle's public :class:`cloudpickle.Pickler`, through pickle's documented
``reducer_override`` hook) serialises every code object with :mod:`marshal`, the interpreter's
own format for code, which keeps the file name, the first line, the line table and every nested
code object (a closure defined inside the function) exactly. Driver and ranks run the same
interpreter (the ranks are started from ``sys.executable``), so the marshal format always
matches. Everything else (globals, closures' cells, classes) is still cloudpickle's, except
importable modules of a ``ModuleType`` subclass (torch's config modules), which cloudpickle
cannot pickle and which travel by name.
"""

from __future__ import annotations

import importlib
import io
import marshal
import pickle
import sys
import types

import cloudpickle


def _code_from_marshal(data: bytes) -> types.CodeType:
    return marshal.loads(data)


def _imported_module(name: str) -> types.ModuleType:
    return importlib.import_module(name)


class _SourceKeepingPickler(cloudpickle.Pickler):
    """cloudpickle's pickler, except that code objects keep their file and lines, and an
    importable module of a ``types.ModuleType`` subclass travels by name."""

    def reducer_override(self, obj):
        if type(obj) is types.CodeType:
            return _code_from_marshal, (marshal.dumps(obj),)
        if (
            isinstance(obj, types.ModuleType)
            and type(obj) is not types.ModuleType
            and sys.modules.get(obj.__name__) is obj
        ):
            # torch's config modules (torch.distributed.config, torch._dynamo.config) are
            # instances of a subclass of ModuleType. cloudpickle reduces plain modules only, so
            # a function that uses ``dist`` and reads any attribute named ``config`` failed
            # with "cannot pickle 'ConfigModuleInstance'": send it by name, as an import.
            return _imported_module, (obj.__name__,)
        return super().reducer_override(obj)


def dumps(obj) -> bytes:
    """Pickle ``obj`` as cloudpickle would, keeping every code object's file name and lines."""
    buffer = io.BytesIO()
    _SourceKeepingPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes):
    """Rebuild what :func:`dumps` pickled (plain :func:`pickle.loads`: cloudpickle's reducers
    are ordinary module-level functions)."""
    return pickle.loads(data)
