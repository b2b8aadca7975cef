"""A function sent to the ranks keeps its file name and lines, whatever cloudpickle does to code.

cloudpickle 3.1.3 rewrites a by-value function's ``co_filename`` to ``"<dynamic-code>"``; hang
reports and "your line" read that name. dtlab's payload pickler must keep the learner's file,
first line and line table, for nested functions too, with any cloudpickle version.
"""

from __future__ import annotations

import types

import cloudpickle

from dtlab.runtime import payload

_SOURCE = """
def outer(x):
    def inner(y):
        return y + 1
    return inner(x) * 2

handler = lambda z: z - 1
"""


def _learner_functions(filename: str = "/home/learner/lab_cell_7.py") -> dict:
    """Functions compiled from a learner's 'file' in a module no rank can import (pickled by
    value, as a notebook cell's are)."""
    namespace = {"__name__": "learner_cell_not_importable"}
    exec(compile(_SOURCE, filename, "exec"), namespace)
    return namespace


def _all_codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_codes(const)


def test_by_value_functions_keep_file_first_line_and_nested_code_files():
    fns = _learner_functions()
    outer, handler = payload.loads(payload.dumps((fns["outer"], fns["handler"])))
    assert outer(3) == 8 and handler(3) == 2
    assert outer.__code__.co_firstlineno == 2 and handler.__code__.co_firstlineno == 7
    for code in (*_all_codes(outer.__code__), handler.__code__):
        assert code.co_filename == "/home/learner/lab_cell_7.py", code.co_name
    # the line table survives: line 4 of the file is inner's return
    inner = next(c for c in _all_codes(outer.__code__) if c.co_name == "inner")
    assert [line for *_, line in inner.co_lines() if line][-1] == 4


def test_the_payload_is_still_cloudpickle_for_what_is_not_code():
    fns = _learner_functions()
    data = payload.dumps({"fn": fns["outer"], "cls": type("Local", (), {"v": 3}), "n": [1, 2]})
    back = payload.loads(data)
    assert back["fn"](1) == 4 and back["cls"].v == 3 and back["n"] == [1, 2]
    # the same object through plain cloudpickle loads too (so either side may be upgraded)
    assert cloudpickle.loads(cloudpickle.dumps(fns["outer"]))(1) == 4


def test_a_rank_sees_the_learners_file_and_line(cluster2):
    fns = _learner_functions("/home/learner/cell_3.py")
    outer = fns["outer"]

    def where_is_my_code(fn):
        return fn.__code__.co_filename, fn.__code__.co_firstlineno

    files = list(cluster2.run(where_is_my_code, outer))
    assert files == [("/home/learner/cell_3.py", 2)] * 2


def test_a_function_using_dist_and_reading_an_attribute_named_config_can_be_sent(cluster2):
    """cloudpickle lists ``torch.distributed.config`` among such a function's submodules (its
    code names ``config``); that module is an instance of a ModuleType subclass, which cloudpickle
    alone cannot pickle."""
    namespace = {"__name__": "learner_cell_not_importable"}
    source = (
        "import torch.distributed as dist\n"
        "def rank_and_width(model):\n"
        "    return dist.get_rank(), model.config\n"
    )
    exec(compile(source, "/home/learner/cell_9.py", "exec"), namespace)

    class Model:
        config = 64

    assert list(cluster2.run(namespace["rank_and_width"], Model())) == [(0, 64), (1, 64)]
