import pytest
import torch

from trajtune.models.tiny import TinyConfig, TinyTransformer


def test_kv_cache_matches_full_forward(tiny_model):
    ids = torch.randint(0, 40, (3, 20), generator=torch.Generator().manual_seed(0))
    full = tiny_model(ids)
    cache = tiny_model.new_cache(3)
    chunks = [tiny_model(ids[:, :7], cache=cache)]
    chunks += [tiny_model(ids[:, t : t + 1], cache=cache) for t in range(7, 20)]
    assert torch.allclose(torch.cat(chunks, 1), full, atol=1e-5)


def test_left_and_right_padding_give_the_same_logits(tiny_model):
    seq = torch.randint(0, 40, (1, 6), generator=torch.Generator().manual_seed(1))
    alone = tiny_model(seq)[0]
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), seq], 1)
    left_mask = torch.tensor([[False] * 3 + [True] * 6])
    right = torch.cat([seq, torch.zeros(1, 3, dtype=torch.long)], 1)
    right_mask = torch.tensor([[True] * 6 + [False] * 3])
    assert torch.allclose(tiny_model(left, attention_mask=left_mask)[0, 3:], alone, atol=1e-5)
    assert torch.allclose(tiny_model(right, attention_mask=right_mask)[0, :6], alone, atol=1e-5)


def test_value_head_and_config_errors():
    m = TinyTransformer(TinyConfig(vocab_size=10, dim=16, n_layers=1, n_heads=2, max_len=8, value_head=True))
    logits, values = m(torch.zeros(2, 5, dtype=torch.long), return_values=True)
    assert logits.shape == (2, 5, 10) and values.shape == (2, 5)
    with pytest.raises(ValueError, match="divisible"):
        TinyConfig(vocab_size=10, dim=10, n_heads=3)
    with pytest.raises(ValueError, match="max_len"):
        m(torch.zeros(1, 9, dtype=torch.long))


def _model(positions: str, n_layers: int = 2) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=n_layers, n_heads=4, max_len=64,
                                      positions=positions)).eval()


@pytest.mark.parametrize("positions", ["rope", "none"])
def test_other_positions_keep_the_cache_and_padding_contracts(positions):
    m = _model(positions)
    assert (m.pos_emb is None) and not any("pos_emb" in n for n, _ in m.named_parameters())
    ids = torch.randint(0, 40, (3, 20), generator=torch.Generator().manual_seed(0))
    full = m(ids)
    cache = m.new_cache(3)
    chunks = [m(ids[:, :7], cache=cache)] + [m(ids[:, t : t + 1], cache=cache) for t in range(7, 20)]
    assert torch.allclose(torch.cat(chunks, 1), full, atol=1e-5)
    seq = ids[:1, :6]
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), seq], 1)
    left_mask = torch.tensor([[False] * 3 + [True] * 6])
    assert torch.allclose(m(left, attention_mask=left_mask)[0, 3:], m(seq)[0], atol=1e-5)


def test_rope_attention_sees_only_relative_offsets():
    from trajtune.models.tiny import _rotary, _rotate

    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(i: int, j: int) -> float:
        (cq, sq), (ck, sk) = _rotary(torch.tensor([[i]]), 16, q.dtype), _rotary(torch.tensor([[j]]), 16, q.dtype)
        return float((_rotate(q, cq, sq) * _rotate(k, ck, sk)).sum())

    assert score(5, 2) == pytest.approx(score(45, 42), abs=1e-4)  # same offset 3, 40 positions later
    assert abs(score(5, 2) - score(5, 4)) > 1e-3  # another offset, another score
    assert score(0, 0) == pytest.approx(float((q * k).sum()), abs=1e-6)  # position 0 is no rotation


def test_learned_positions_see_absolute_position_and_none_does_not():
    """One layer: the last token's logits are a function of the set of earlier tokens without positions,
    so reordering the prefix leaves them unchanged; learned positions (and rope) tell the orders apart."""
    a = torch.tensor([[5, 6, 7, 8, 9]])
    b = torch.tensor([[8, 6, 5, 7, 9]])  # same prefix tokens, same last token, another order
    none, learned = _model("none", n_layers=1), _model("learned", n_layers=1)
    assert torch.allclose(none(a)[0, -1], none(b)[0, -1], atol=1e-5)
    assert not torch.allclose(learned(a)[0, -1], learned(b)[0, -1], atol=1e-4)
    assert not torch.allclose(_model("rope", 1)(a)[0, -1], _model("rope", 1)(b)[0, -1], atol=1e-4)


def test_positions_errors_and_checkpoint(tmp_path):
    from trajtune.models.tiny import load_model, save_model

    with pytest.raises(ValueError, match="positions='alibi' is not one of learned, rope, none"):
        TinyConfig(vocab_size=10, positions="alibi")
    with pytest.raises(ValueError, match="even head size"):
        TinyConfig(vocab_size=10, dim=12, n_heads=4, positions="rope")
    m = _model("rope")
    save_model(tmp_path / "m", m)
    back, _ = load_model(tmp_path / "m")
    ids = torch.tensor([[1, 2, 3, 4]])
    assert back.config.positions == "rope" and torch.equal(back(ids), m(ids))
