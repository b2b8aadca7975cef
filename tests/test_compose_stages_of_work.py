"""``dtlab.parallel.compose`` is split by stage of work — apply, step, account — and names its
parameters once instead of matching tensors by ``id()`` or stripping wrapper prefixes."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from dtlab.parallel.compose import account, apply, step

COMPOSE = Path(apply.__file__).parent


def test_each_stage_of_work_has_its_own_file_and_the_composed_model_takes_it_from_there():
    composed = apply.ComposedGPT
    assert inspect.getmodule(composed.train_step) is step
    assert inspect.getmodule(composed.clip_grad_norm_) is step
    assert inspect.getmodule(composed.traffic) is account
    assert inspect.getmodule(composed.local_full_gradients) is account
    assert inspect.getmodule(composed.communicators.fget) is account
    assert inspect.getmodule(apply.compose_gpt) is apply


def test_compose_never_matches_parameters_by_id_or_strips_wrapper_prefixes():
    found = []
    for path in sorted(COMPOSE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if call and node.func.id == "id":
                found.append(f"{path.name}:{node.lineno}: id()")
            if isinstance(node, ast.Constant) and node.value in (
                "module.",
                "_fsdp_wrapped_module.",
            ):
                found.append(f"{path.name}:{node.lineno}: prefix {node.value!r}")
    assert not found, found


def test_a_tied_head_on_the_same_rank_as_the_embedding_is_named_once():
    import torch.nn as nn

    first, last = nn.Module(), nn.Module()
    first.embed = nn.Embedding(4, 2)
    last.lm_head = nn.Linear(2, 4, bias=False)
    last.lm_head.weight = first.embed.weight
    names = apply.name_parameters([first, last], tied=True)
    assert list(names) == ["embed.weight"]
    untied = apply.name_parameters([first], tied=False)
    assert list(untied) == ["embed.weight"]
