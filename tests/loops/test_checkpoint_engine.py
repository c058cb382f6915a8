import json

import pytest
import torch

from trajtune.algorithms.sft import sft_loss_fn
from trajtune.checkpoint import CheckpointError, atomic_dir
from trajtune.models.tiny import load_model, save_model
from trajtune.engine import make_engine, OptimConfig
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner, Trajectory, collate


def demo_batch(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        t = Trajectory()
        t.append(torch.randint(3, 40, (3 + i,), generator=g).tolist(), Owner.PROMPT, 0)
        t.append(torch.randint(3, 40, (2 + i,), generator=g).tolist(), Owner.POLICY, 0)
        trajs.append(t)
    return collate(trajs, pad_id=0)


def test_model_round_trip(tiny_model, tmp_path):
    tok = CharTokenizer.from_corpus("abc")
    save_model(tmp_path / "ck", tiny_model, tok, meta={"note": "x"})
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["meta"] == {"note": "x"}
    model, tok2 = load_model(tmp_path / "ck")
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.eval()(ids), tiny_model(ids))
    assert tok2.itos == tok.itos
    assert not list(tmp_path.glob(".ck*"))  # no temporary leftovers


def test_corrupted_checkpoint_is_a_clear_error(tiny_model, tmp_path):
    save_model(tmp_path / "ck", tiny_model)
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path / "missing")


def test_failed_save_leaves_previous_checkpoint(tiny_model, tmp_path):
    save_model(tmp_path / "ck", tiny_model)
    before = (tmp_path / "ck" / "model.safetensors").read_bytes()
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_dir(tmp_path / "ck") as tmp:
            (tmp / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("disk full")
    assert (tmp_path / "ck" / "model.safetensors").read_bytes() == before
    load_model(tmp_path / "ck")


def test_gradient_accumulation_equals_one_big_step(tiny_model):
    import copy

    batch = demo_batch(4)
    loss_fn = sft_loss_fn("sequence")
    a = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2))
    b = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2))
    a.forward_backward(batch, loss_fn)
    for half in ([0, 1], [2, 3]):  # "sequence" aggregation averages rows: halves weigh 1/2 each
        b.forward_backward(batch.select(half), loss_fn, scale=0.5)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6)
    ma, mb = a.optim_step(), b.optim_step()
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-5) and a.step == 1


def test_engine_state_round_trip_continues_identically(tiny_model, tmp_path):
    import copy

    batch, loss_fn = demo_batch(4), sft_loss_fn()
    a = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2, warmup_steps=3))
    for _ in range(2):
        a.forward_backward(batch, loss_fn)
        a.optim_step()
    a.save_state(tmp_path / "state", extra={"data_step": 2})
    b = make_engine(copy.deepcopy(tiny_model), OptimConfig(lr=1e-2, warmup_steps=3))
    assert b.load_state(tmp_path / "state") == {"data_step": 2} and b.step == 2
    for e in (a, b):
        e.forward_backward(batch, loss_fn)
        e.optim_step()
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_sft_step_lowers_loss(tiny_model):
    engine = make_engine(tiny_model, OptimConfig(lr=3e-3))
    batch, loss_fn = demo_batch(4), sft_loss_fn()
    first = engine.forward_backward(batch, loss_fn)["loss"]
    engine.optim_step()
    for _ in range(20):
        engine.forward_backward(batch, loss_fn)
        engine.optim_step()
    assert engine.forward_backward(batch, loss_fn)["loss"] < first - 0.5


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_micro_batching_gives_the_one_batch_gradient(tiny_model, mode):
    import copy

    batch, loss_fn = demo_batch(5), sft_loss_fn(mode)  # rows of different lengths: token shares != row shares
    whole = make_engine(copy.deepcopy(tiny_model))
    split = make_engine(copy.deepcopy(tiny_model), micro_batch_size=2)
    mw, ms = whole.forward_backward(batch, loss_fn), split.forward_backward(batch, loss_fn)
    assert ms["loss"] == pytest.approx(mw["loss"], rel=1e-5)
    for pa, pb in zip(whole.model.parameters(), split.model.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6)
