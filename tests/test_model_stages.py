"""split_into_stages: stages run one after another reproduce the full model exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from dtlab.models import (
    GPT,
    MLP,
    GPTConfig,
    SyntheticTokens,
    balanced_stage_layers,
    loss_fn,
    split_into_stages,
)


def _run_pipeline(stages, inputs, targets):
    """Forward stage by stage, each taking a detached copy of the previous output (what a
    receive gives it), then backward from the last stage, handing each input's gradient back."""
    received, outputs, x = [], [], inputs
    for stage in stages:
        if not stage.is_first:
            x = x.detach().requires_grad_()
        received.append(x)
        x = stage(x)
        outputs.append(x)
    loss = loss_fn(outputs[-1], targets)
    loss.backward()
    for k in range(len(stages) - 2, -1, -1):
        outputs[k].backward(received[k + 1].grad)
    return outputs[-1], loss


def _full_model_run(config):
    model = GPT(config, seed=11)
    inputs, targets = SyntheticTokens(config, 1, 4, seed=2)[0]
    logits = model(inputs)
    loss = loss_fn(logits, targets)
    loss.backward()
    return model, inputs, targets, logits, loss


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("n_stages", [1, 2, 3])
def test_stages_in_one_process_reproduce_full_model_loss_and_grads_bitwise(n_stages, tied):
    config = GPTConfig.tiny(n_layers=3, tie_embeddings=tied)
    full, inputs, targets, logits, loss = _full_model_run(config)
    model = GPT(config, seed=11)
    stages = split_into_stages(model, n_stages)
    stage_logits, stage_loss = _run_pipeline(stages, inputs, targets)
    assert torch.equal(stage_logits, logits) and torch.equal(stage_loss, loss)
    full_grads = {n: p.grad for n, p in full.named_parameters()}
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, full_grads[name]), name


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_stages_on_separate_ranks_match_once_tied_grads_are_summed(tied):
    """Each stage deep-copied on its own, as if on its own rank: the tied embedding becomes two
    copies, and summing their gradients (the all-reduce a pipeline runs over the first and last
    stage) gives the full model's gradient exactly."""
    config = GPTConfig.tiny(n_layers=4, tie_embeddings=tied)
    full, inputs, targets, logits, loss = _full_model_run(config)
    stages = [copy.deepcopy(s) for s in split_into_stages(GPT(config, seed=11), 3)]
    assert [list(s.layers) for s in stages] == [[0, 1], [2], [3]]
    _, stage_loss = _run_pipeline(stages, inputs, targets)
    assert torch.equal(stage_loss, loss)
    tied_names = [s.tied_parameters for s in stages]
    if tied:
        assert tied_names == [{"embed.weight": "embedding"}, {}, {"lm_head.weight": "embedding"}]
        first, last = stages[0].embed.weight, stages[-1].lm_head.weight
        assert first is not last
        assert not torch.equal(first.grad, full.embed.weight.grad)  # each copy has half the story
        summed = first.grad + last.grad
        first.grad, last.grad = summed, summed.clone()
    else:
        assert tied_names == [{}, {}, {}]
    full_params = dict(full.named_parameters())
    full_params.setdefault("lm_head.weight", full.lm_head.weight)
    seen = set()
    for stage in stages:
        for name, p in stage.named_parameters():  # the full model's names
            assert torch.equal(p.grad, full_params[name].grad), name
            seen.add(name)
    assert seen == set(full_params)


def test_explicit_boundaries_allow_a_stage_with_only_the_embedding_or_the_head():
    config = GPTConfig.tiny(n_layers=2, tie_embeddings=False)
    full, inputs, targets, logits, loss = _full_model_run(config)
    model = GPT(config, seed=11)
    stages = split_into_stages(model, 4, boundaries=[0, 1, 2])
    assert [list(s.layers) for s in stages] == [[], [0], [1], []]
    assert [s.is_first for s in stages] == [True, False, False, False]
    assert [s.is_last for s in stages] == [False, False, False, True]
    stage_logits, _ = _run_pipeline(stages, inputs, targets)
    assert torch.equal(stage_logits, logits)
    assert torch.equal(model.embed.weight.grad, full.embed.weight.grad)


def test_balanced_split_gives_earlier_stages_the_extra_blocks():
    assert balanced_stage_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert balanced_stage_layers(4, 4) == [range(i, i + 1) for i in range(4)]


def test_splitting_refuses_more_stages_than_blocks_and_bad_boundaries():
    model = GPT(GPTConfig.tiny(n_layers=2))
    with pytest.raises(ValueError, match="n_stages=3 exceeds the model's 2 blocks.*from 1 to 2"):
        split_into_stages(model, 3)
    with pytest.raises(ValueError, match="3 stages need 2"):
        split_into_stages(model, 3, boundaries=[1])
    with pytest.raises(ValueError, match="non-decreasing block indices in 0..2"):
        split_into_stages(model, 3, boundaries=[2, 1])


class _LayerNumberedAux(MLP):
    """A dense MLP whose aux loss is ``layer + 1``, so a sum names the layers it came from."""

    def __init__(self, config, layer, device) -> None:
        super().__init__(config, device)
        self.layer = layer

    def forward(self, x):
        return super().forward(x), torch.tensor(float(self.layer + 1))


def test_each_stage_sums_only_its_own_blocks_aux_losses():
    config = GPTConfig.tiny(n_layers=3)
    stages = split_into_stages(GPT(config, mlp_factory=_LayerNumberedAux), 2)
    h = stages[0](SyntheticTokens(config, 1, 2)[0][0])
    assert h.shape == (2, config.seq_len, config.d_model)
    stages[1](h)
    assert stages[0].aux_loss.item() == 1.0 + 2.0  # blocks 0 and 1
    assert stages[1].aux_loss.item() == 3.0  # block 2
