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
