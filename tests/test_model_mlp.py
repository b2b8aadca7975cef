"""MLP factories, auxiliary losses, and untied embeddings."""

from __future__ import annotations

import torch

from dtlab.models import GPT, MLP, GPTConfig, SyntheticTokens, loss_fn


class _MLPWithAux(MLP):
    """The dense MLP plus a made-up router loss: what a mixture-of-experts layer returns."""

    def __init__(self, config, device, scale: float) -> None:
        super().__init__(config, device)
        self.scale = scale

    def forward(self, x):
        out = super().forward(x)
        return out, self.scale * out.pow(2).mean()


def test_mlp_factory_builds_each_block_and_the_model_sums_their_aux_losses():
    config = GPTConfig.tiny(n_layers=3)
    layers_built = []

    def factory(config, layer, device):
        layers_built.append(layer)
        return (
            _MLPWithAux(config, device, scale=float(layer + 1))
            if layer != 1
            else MLP(config, device)
        )

    model = GPT(config, seed=6, mlp_factory=factory)
    inputs, targets = SyntheticTokens(config, 1, 2)[0]
    logits = model(inputs)
    assert layers_built == [0, 1, 2]
    # Same parameter names as the default model, so the same init and the same logits.
    assert torch.equal(logits, GPT(config, seed=6)(inputs))
    blocks = model.blocks
    assert blocks[1].aux_loss is None
    assert torch.equal(model.aux_loss, blocks[0].aux_loss + blocks[2].aux_loss)
    assert model.aux_loss.item() > 0
    (loss_fn(logits, targets) + model.aux_loss).backward()
    assert blocks[0].mlp.fc_out.weight.grad.abs().sum() > 0


def test_aux_loss_gradient_reaches_only_the_blocks_before_and_at_its_mlp():
    config = GPTConfig.tiny(n_layers=2)

    def factory(config, layer, device):
        return _MLPWithAux(config, device, 1.0) if layer == 0 else MLP(config, device)

    model = GPT(config, mlp_factory=factory)
    model(SyntheticTokens(config, 1, 2)[0][0])
    model.aux_loss.backward()
    assert model.blocks[0].mlp.fc_in.weight.grad.abs().sum() > 0
    assert model.blocks[1].mlp.fc_in.weight.grad is None  # after block 0's MLP: untouched


def test_untied_embeddings_train_two_separate_matrices():
    config = GPTConfig.tiny(tie_embeddings=False)
    model = GPT(config, seed=0)
    assert not torch.equal(model.lm_head.weight, model.embed.weight)  # drawn by name
    inputs, targets = SyntheticTokens(config, 1, 4)[0]
    loss_fn(model(inputs), targets).backward()
    unused = torch.ones(config.vocab_size, dtype=torch.bool)
    unused[inputs.unique()] = False
    assert unused.any()
    # The embedding gets gradient only for tokens that were looked up; the head for every row.
    assert model.embed.weight.grad[unused].abs().sum() == 0
    assert (model.lm_head.weight.grad.abs().sum(dim=1) > 0).all()
    assert model.num_params() == config.num_params()
