"""Persona tools (book ch.17): capping projects exactly to tau, steering adds alpha*v to the residual stream, on the
tiny model and on a Hugging Face Llama; persona vectors, composition, the 25th-percentile tau, subnetwork masks."""

import pytest
import torch

from trajtune.models.steering import (calibrate_tau, cap, capping, compose, mean_activation, persona_mask,
                                      persona_vector, projection, residual_layers, residuals, steering)
from trajtune.models.tiny import TinyConfig, TinyTransformer


def test_capping_projects_exactly_to_tau():
    v = torch.tensor([3.0, 4.0])  # v_hat = (0.6, 0.8)
    h = torch.tensor([[1.0, 0.0], [5.0, 5.0]])  # projections 0.6 and 7.0
    out = cap(h, v, tau=2.0)
    # below tau: h - v_hat (0.6 - 2) = (1 + 0.84, 0 + 1.12); above: unchanged
    assert out.flatten().tolist() == pytest.approx([1.84, 1.12, 5.0, 5.0])
    assert projection(out, v).tolist() == pytest.approx([2.0, 7.0])
    # the part orthogonal to v is untouched: (1, 0) - 0.6 v_hat = (0.64, -0.48)
    orth = out[0] - projection(out[0], v) * torch.tensor([0.6, 0.8])
    assert orth.tolist() == pytest.approx([0.64, -0.48])
    g = torch.Generator().manual_seed(0)
    many = torch.randn(50, 8, generator=g)
    d = torch.randn(8, generator=g)
    tau = calibrate_tau(projection(many, d))
    capped = projection(cap(many, d, tau), d)
    assert torch.allclose(capped, projection(many, d).clamp(min=tau), atol=1e-5)
    assert (projection(many, d) < tau).float().mean().item() == pytest.approx(0.24, abs=0.03)  # the 25th percentile


def test_vectors_by_hand():
    pos = torch.tensor([[1.0, 2.0], [3.0, 2.0]])
    neg = torch.tensor([[0.0, 1.0]])
    assert persona_vector(pos, neg).tolist() == [2.0, 1.0]
    assert compose([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])], [2.0, -0.5]).tolist() == [2.0, -1.0]
    acts = torch.arange(12.0).reshape(1, 3, 4)
    assert mean_activation(acts, torch.tensor([[0, 1, 1]])).tolist() == [6.0, 7.0, 8.0, 9.0]  # rows 1 and 2
    with pytest.raises(ValueError, match="selects no token"):
        mean_activation(acts, torch.zeros(1, 3))
    with pytest.raises(ValueError, match="zero"):
        cap(torch.ones(2), torch.zeros(2), 0.0)


def test_persona_mask_keeps_the_top_connections_per_row():
    w = torch.tensor([[1.0, -4.0, 2.0], [0.5, 0.5, -3.0]])
    a = torch.tensor([2.0, 0.5, 1.0])  # S = [[2, 2, 2], [1, 0.25, 3]]
    assert persona_mask(w, a, keep=1 / 3).tolist() == [[1, 0, 0], [0, 0, 1]]  # ties: the lower column
    assert persona_mask(w, a, keep=2 / 3).tolist() == [[1, 1, 0], [1, 0, 1]]
    with pytest.raises(ValueError, match="keep must be"):
        persona_mask(w, a, keep=0)


def check_model(model, ids, layer):
    d = model.config.dim if hasattr(model, "blocks") else model.base_config.hidden_size
    v = torch.randn(d, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(ids)
        with residuals(model, [layer]) as plain:
            model(ids)
        with steering(model, layer, v, 0.0):
            assert torch.equal(model(ids), base)
        with steering(model, layer, v, 2.5), residuals(model, [layer]) as steered:
            moved = model(ids)
        assert not torch.allclose(moved, base)
        assert torch.allclose(steered[layer][0] - plain[layer][0], (2.5 * v).expand_as(plain[layer][0]), atol=1e-4)
        tau = calibrate_tau(projection(plain[layer][0], v), 0.5)
        with capping(model, layer, v, tau), residuals(model, [layer]) as capped:
            model(ids)
        p = projection(capped[layer][0], v)
        assert p.min().item() >= tau - 1e-4
        assert torch.equal(model(ids), base)  # every hook removed on leaving


def test_tiny_transformer_hooks():
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=20, dim=16, n_layers=2, n_heads=2, max_len=16)).eval()
    assert len(residual_layers(model)) == 2
    check_model(model, torch.randint(0, 20, (2, 7)), 1)
    with pytest.raises(IndexError, match="has 2 blocks"):
        with steering(model, 5, torch.zeros(16), 1.0):
            pass


def test_hugging_face_llama_hooks(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models import hf
    from trajtune.models.hf_random import make_random_model

    path = make_random_model(tmp_path / "llama", arch="llama", size="tiny")
    policy = hf.load_policy(path).eval()
    assert len(residual_layers(policy)) == policy.base_config.num_hidden_layers
    check_model(policy, torch.randint(3, 100, (2, 6)), 0)
    with pytest.raises(TypeError, match="no transformer blocks"):
        residual_layers(torch.nn.Linear(2, 2))
