"""Model merging (book ch.3.3, appendix C): linear interpolation, task arithmetic and slerp by hand, and whole model
directories (a trajtune checkpoint, a Hugging Face model) merged into ones that load and run."""

import math

import pytest
import torch

from trajtune.models.merging import merge_dirs, merge_state_dicts
from trajtune.models.tiny import TinyConfig, TinyTransformer, load_model, save_model


def test_linear_task_arithmetic_and_slerp_by_hand():
    a = {"w": torch.tensor([1.0, 2.0]), "step": torch.tensor([3])}
    b = {"w": torch.tensor([3.0, 6.0]), "step": torch.tensor([3])}
    base = {"w": torch.tensor([1.0, 1.0]), "step": torch.tensor([3])}
    assert merge_state_dicts([a, b])["w"].tolist() == [2.0, 4.0]
    assert merge_state_dicts([a, b], weights=[0.25, 0.75])["w"].tolist() == [2.5, 5.0]
    # base + 1 (a - base) + 0.5 (b - base) = (1, 1) + (0, 1) + (1, 2.5)
    assert merge_state_dicts([a, b], "task_arithmetic", [1.0, 0.5], base)["w"].tolist() == [2.0, 4.5]
    x, y = {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 2.0])}
    mid = merge_state_dicts([x, y], "slerp", t=0.5)["w"]  # angle 90 degrees: sin(45)/sin(90) of each
    assert mid.tolist() == pytest.approx([math.sqrt(0.5), 2 * math.sqrt(0.5)])
    assert merge_state_dicts([x, y], "slerp", t=0.0)["w"].tolist() == pytest.approx([1.0, 0.0])
    assert merge_state_dicts([a, b])["step"].tolist() == [3]


def test_refusals_name_the_problem():
    a, b = {"w": torch.zeros(2)}, {"w": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"'w' is \(3,\) in model 1 but \(2,\) in model 0"):
        merge_state_dicts([a, b])
    with pytest.raises(ValueError, match="does not have the tensors"):
        merge_state_dicts([a, {"v": torch.zeros(2)}])
    with pytest.raises(ValueError, match="must sum to 1"):
        merge_state_dicts([a, a], weights=[0.5, 0.7])
    with pytest.raises(ValueError, match="needs the base"):
        merge_state_dicts([a, a], "task_arithmetic")
    with pytest.raises(ValueError, match="non-float tensor 'n' differs"):
        merge_state_dicts([{"n": torch.tensor([1])}, {"n": torch.tensor([2])}])


def test_merge_trajtune_checkpoints(tmp_path):
    cfg = TinyConfig(vocab_size=12, dim=8, n_layers=1, n_heads=2, max_len=8)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        dirs.append(save_model(tmp_path / f"m{seed}", TinyTransformer(cfg)))
    out = merge_dirs(dirs, tmp_path / "merged", weights=[0.5, 0.5])
    merged, _ = load_model(out)
    m0, m1 = load_model(dirs[0])[0], load_model(dirs[1])[0]
    for (k, v), v0, v1 in zip(merged.state_dict().items(), m0.state_dict().values(), m1.state_dict().values()):
        assert torch.allclose(v, (v0 + v1) / 2), k
    with pytest.raises(FileExistsError, match="nothing is overwritten"):
        merge_dirs(dirs, out)


def test_merge_hugging_face_models(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from trajtune.models.hf_random import make_random_model

    a = make_random_model(tmp_path / "a", seed=0)
    b = make_random_model(tmp_path / "b", seed=1)
    out = merge_dirs([a, b], tmp_path / "soup")
    assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
    ma, mb, mo = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b, out))
    for (k, v), va, vb in zip(mo.state_dict().items(), ma.state_dict().values(), mb.state_dict().values()):
        assert torch.allclose(v, (va + vb) / 2, atol=1e-6), k
    ids = torch.tensor([[3, 4, 5]])
    assert mo(ids).logits.shape[-1] == ma.config.vocab_size


def test_the_command_line(tmp_path, capsys):
    from trajtune.cli import main

    cfg = TinyConfig(vocab_size=12, dim=8, n_layers=1, n_heads=2, max_len=8)
    a = save_model(tmp_path / "a", TinyTransformer(cfg))
    b = save_model(tmp_path / "b", TinyTransformer(cfg))
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "model.safetensors").exists()
    assert main(["merge", str(a), str(tmp_path / "nope"), "--out", str(tmp_path / "n")]) == 2
    assert "nope: no such directory or file" in capsys.readouterr().err
    assert main(["merge", str(a), str(b), "--method", "task_arithmetic", "--out", str(tmp_path / "t")]) == 2
    assert "needs the base" in capsys.readouterr().err and not (tmp_path / "t").exists()
