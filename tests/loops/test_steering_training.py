"""Preventative steering during fine-tuning (17.2d) and data screening by projection difference (17.2e)."""

import pytest
import torch

from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.models.steering import (persona_vector, preventative_steering, projection, projection_difference,
                                      response_activations, screen_by_projection, steering)
from trajtune.trajectory import Owner, collate

from test_algorithms import TOK, demo, engine

TRAIT = [demo("b" * k) for k in (1, 2, 3, 4)]  # the data that instils the "trait": replies of b's
NEUTRAL = [demo("a" * k) for k in (1, 2, 3, 4)]


def acts(model, trajs, layer=0):
    """[N, D]: each episode's mean residual activation after block `layer` over its reply (POLICY) tokens."""
    batch = collate(trajs, TOK.pad_id)
    mask = torch.tensor([[int(o == Owner.POLICY) for o in t.owners] + [0] * (batch.ids.shape[1] - len(t))
                         for t in trajs])
    return response_activations(model, batch.ids, mask, layer)


def test_preventative_steering_acts_on_training_forwards_only():
    e = engine(seed=0)
    ids = collate(NEUTRAL, TOK.pad_id).ids
    v = torch.randn(32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = e.model.eval()(ids)
        with steering(e.model, 0, v, 2.0):
            steered = e.model(ids)
        with preventative_steering(e.model, 0, v, 2.0):
            assert torch.equal(e.model.eval()(ids), plain)  # eval mode: sampling, scoring, evaluation
            assert torch.equal(e.model.train()(ids), steered)  # train mode: the update's forward
        assert torch.equal(e.model.train()(ids), plain)  # the hook is gone after the block
    assert not torch.equal(steered, plain)


def test_preventative_steering_keeps_the_trait_out_of_the_weights():
    """SFT on the trait data moves the unsteered model's activations along the trait direction v; with
    preventative steering toward v during the same SFT (alpha 3 on the unit vector) they move less than half as
    far (prototype, seeds 0-3: shifts 4.09 / 3.48 / 4.56 / 1.45 without, 1.39 / 1.04 / 0.52 / 0.73 with)."""
    shifts = {}
    for alpha in (0.0, 3.0):
        e = engine(seed=0)
        v = persona_vector(acts(e.model, TRAIT), acts(e.model, NEUTRAL))  # mean b-reply minus mean a-reply
        before = projection(acts(e.model, NEUTRAL + TRAIT), v).mean().item()
        with preventative_steering(e.model, 0, v / v.norm(), alpha):
            history = train_sft(e, TRAIT * 2, SFTConfig(steps=30, batch_size=8), TOK.pad_id)
        assert history[-1]["train/loss"] < history[0]["train/loss"]  # it still fits the data
        shifts[alpha] = projection(acts(e.model, NEUTRAL + TRAIT), v).mean().item() - before
    assert shifts[0.0] > 1.0 and shifts[3.0] < 0.5 * shifts[0.0]


def test_projection_difference_and_screening_by_hand():
    v = torch.tensor([3.0, 4.0])  # v_hat = (0.6, 0.8)
    data = torch.tensor([[1.0, 0.0], [5.0, 5.0]])  # projections 0.6, 7.0
    base = torch.tensor([[0.0, 1.0], [1.0, 1.0]])  # projections 0.8, 1.4
    diff = projection_difference(data, base, v)
    assert diff.tolist() == pytest.approx([-0.2, 5.6])
    assert screen_by_projection(diff, threshold=1.0).tolist() == [True, False]
    with pytest.raises(ValueError, match="base_acts"):
        projection_difference(data, base[:1], v)


def test_screening_flags_the_trait_samples_of_a_mixed_set():
    e = engine(seed=0)
    v = persona_vector(acts(e.model, TRAIT), acts(e.model, NEUTRAL))
    data = [TRAIT[0], NEUTRAL[1], TRAIT[2], NEUTRAL[3]]
    base = NEUTRAL  # the base model's own answers to the same prompts: a's
    diff = projection_difference(acts(e.model, data), acts(e.model, base), v)
    assert diff[1].item() == pytest.approx(0.0, abs=1e-5) and diff[3].item() == pytest.approx(0.0, abs=1e-5)
    assert min(diff[0].item(), diff[2].item()) > 0.05  # 0.10 and 0.15 on this seed
    assert screen_by_projection(diff, threshold=0.025).tolist() == [False, True, False, True]
