"""ODPO and REBEL in the DPO loop (issue 31, book ch.8.2): each pair's score difference comes from its row
('score_chosen' / 'score_rejected', or 'margin'), reaches the loss through the pair batch, and a row without one is
a clear error, from the recipe API and from `trajtune dpo`."""

import json
import math

import pytest
import torch

pytest.importorskip("transformers")

from trajtune.algorithms.dpo import (  # noqa: E402
    DPOConfig, MissingScores, labelled_pairs, pair_set, preference_loss_fn, score_difference, train_dpo, with_ref_sums)
from trajtune.metrics import is_documented  # noqa: E402
from trajtune.engine import ForwardOutput, OptimConfig, make_engine  # noqa: E402
from trajtune.models.hf_random import train_tokenizer  # noqa: E402
from trajtune.models.tiny import TinyConfig, TinyTransformer  # noqa: E402
from trajtune.sources import data as D  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402
from trajtune.trajectory import Owner, Trajectory  # noqa: E402


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(train_tokenizer())


ROWS = [  # pair 0: scores 7 - 4 = 3; pair 1: a margin column of 1
    {"prompt": "what is 2+5?", "chosen": "7", "rejected": "hello", "score_chosen": 7.0, "score_rejected": 4.0},
    {"prompt": "what is 1+5?", "chosen": "6", "rejected": "the answer is no", "margin": 1.0},
]


def pairs_of(renderer, rows):
    return D.preference_pairs([D.Row(r, f"pairs.jsonl:{i + 1}") for i, r in enumerate(rows)], renderer)


def test_score_columns_reach_the_pair_batch(renderer):
    pairs = pairs_of(renderer, ROWS)
    assert [score_difference(c.info) for c, _ in pairs] == [3.0, 1.0]
    full = pair_set(pairs, renderer.pad_id, DPOConfig(loss="rebel"))
    assert full.pref.score_diff.tolist() == [3.0, 1.0, 3.0, 1.0]  # [2P]: chosen rows, then rejected rows
    assert pair_set(pairs, renderer.pad_id, DPOConfig(loss="dpo")).pref is None  # no score differences
    with pytest.raises(D.DataError, match=r"pairs.jsonl:1: field 'score_chosen' without 'score_rejected'"):
        pairs_of(renderer, [{**ROWS[1], "score_chosen": 2.0}])
    with pytest.raises(D.DataError, match=r"field 'margin' \(2.0\) is not 'score_chosen' - 'score_rejected' \(3.0\)"):
        pairs_of(renderer, [{**ROWS[0], "margin": 2.0}])


def test_odpo_and_rebel_losses_by_hand_on_the_batch_path(renderer):
    pairs = pairs_of(renderer, ROWS)
    full = pair_set(pairs, renderer.pad_id, DPOConfig(loss="odpo"))
    mask = full.action_mask  # [4, T-1]
    n = mask.sum(-1)  # POLICY tokens per row
    # policy: -1 per token; reference sums: the policy's sums shifted so that h = +1 on pair 0 and -1 on pair 1
    logprobs = -mask.float()
    sums = -n.float()
    ref = sums - torch.tensor([1.0, 0.0, 0.0, 1.0])  # chosen 0 up by 1; rejected 1 up by 1
    batch = with_ref_sums(full, ref)
    out = ForwardOutput(logprobs=logprobs)
    # ODPO, beta 0.5, alpha 2, log: Delta = 2 log 3 (pair 0), 2 log 1 = 0 (pair 1)
    #   pair 0: -log sigma(0.5 - 2 log 3);  pair 1: -log sigma(-0.5)
    odpo, m = preference_loss_fn(DPOConfig(loss="odpo", beta=0.5, odpo_alpha=2.0)).fn(out, batch)
    want = (math.log1p(math.exp(-(0.5 - 2 * math.log(3)))) + math.log1p(math.exp(0.5))) / 2
    assert odpo.item() == pytest.approx(want, rel=1e-5)
    assert m["dpo/margin"].item() == pytest.approx(0.0, abs=1e-6)  # beta (h_0 + h_1) / 2 = 0
    # identity f: Delta = 2 * 3 = 6 and 2 * 1 = 2
    identity = DPOConfig(loss="odpo", beta=0.5, odpo_alpha=2.0, odpo_scale="identity")
    ident, _ = preference_loss_fn(identity).fn(out, batch)
    want = (math.log1p(math.exp(-(0.5 - 6.0))) + math.log1p(math.exp(-(-0.5 - 2.0)))) / 2
    assert ident.item() == pytest.approx(want, rel=1e-5)
    # REBEL, beta 0.5 (eta 2): ((0.5 - 3)^2 + (-0.5 - 1)^2) / 2 = (6.25 + 2.25) / 2 = 4.25
    rebel_pairs = with_ref_sums(pair_set(pairs, renderer.pad_id, DPOConfig(loss="rebel")), ref)
    rebel, m = preference_loss_fn(DPOConfig(loss="rebel", beta=0.5)).fn(out, rebel_pairs)
    assert rebel.item() == pytest.approx(4.25, rel=1e-6)
    assert m["rebel/target"].item() == pytest.approx(2.0) and m["rebel/accuracy"].item() == 0.5


def tiny_engine(renderer, seed=0):
    torch.manual_seed(seed)
    vocab = len(renderer.tokenizer)
    return make_engine(TinyTransformer(TinyConfig(vocab, dim=16, n_layers=1, n_heads=2, max_len=64)),
                       OptimConfig(lr=1e-2))


def test_the_loop_trains_odpo_and_rebel_from_the_columns(renderer):
    pairs = pairs_of(renderer, ROWS)
    # step 1: the policy is the reference, h = 0: ODPO (alpha 1, log) = (log(1 + 3) + log(1 + 1)) / 2,
    # REBEL = (9 + 1) / 2
    h = train_dpo(tiny_engine(renderer), pairs, DPOConfig(steps=1, loss="odpo"), renderer.pad_id)
    assert h[0]["train/loss"] == pytest.approx((math.log(4) + math.log(2)) / 2, rel=1e-5)
    h = train_dpo(tiny_engine(renderer), pairs, DPOConfig(steps=12, loss="rebel", beta=0.5), renderer.pad_id)
    assert h[0]["train/loss"] == pytest.approx(5.0, rel=1e-5)
    # REBEL regresses beta h onto (3, 1): the margin climbs from 0 toward their mean 2 and the loss falls
    assert h[-1]["rebel/margin"] > 1.0 and h[-1]["train/loss"] < 1.0
    assert all(is_documented(k) for row in h for k in row if k not in ("step", "time", "stage"))


def test_online_pairs_carry_their_rewards_as_scores():
    def ep(reward):
        t = Trajectory(reward=reward)
        t.append([1], Owner.PROMPT, 0)
        t.append([2], Owner.POLICY, 0)
        return t

    (chosen, rejected), = labelled_pairs([ep(0.25), ep(1.0)], 2)[0]
    assert chosen.reward == 1.0 and score_difference(chosen.info) == pytest.approx(0.75)


def test_a_pair_without_its_score_is_an_error_naming_the_row_and_the_loss(renderer, tmp_path, capsys):
    pairs = pairs_of(renderer, [ROWS[0], {"prompt": "hi", "chosen": "a", "rejected": "b"}])
    with pytest.raises(MissingScores, match=r"^pairs.jsonl:2: loss 'rebel' needs each pair's score difference: "
                                          r"'score_chosen' and 'score_rejected' columns, or a 'margin' column"):
        train_dpo(tiny_engine(renderer), pairs, DPOConfig(steps=1, loss="rebel"), renderer.pad_id)

    from trajtune.cli import main
    from trajtune.models.hf_random import make_random_model

    make_random_model(tmp_path / "model", "qwen2", "tiny")
    capsys.readouterr()  # the model writer's progress bar
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [ROWS[0], {"prompt": "hi", "chosen": "a", "rejected": "b"}]))
    assert main(["dpo", "--loss", "odpo", "--model", str(tmp_path / "model"), "--data", str(data),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"trajtune: error: {data}:2: --loss odpo needs each pair's score difference")


def test_slic_and_apo_train_in_the_dpo_loop(renderer):
    """SLiC-HF and APO-zero / APO-down (checklist 8.2l, 8.2n, 8.2o) through `train_dpo` and `trajtune dpo --loss`."""
    from trajtune.algorithms.dpo import summed_logps
    from trajtune.objectives.preference import slic_hinge_loss

    pairs = pairs_of(renderer, ROWS)
    engine = tiny_engine(renderer)
    full = pair_set(pairs, renderer.pad_id, DPOConfig(loss="slic"))
    with torch.no_grad():
        sums = summed_logps(engine.forward(full).logprobs, full.action_mask)
    expect = slic_hinge_loss(sums[:2], sums[2:], 30.0)[0].item()  # the summed margin starts near 18 nats
    h = train_dpo(engine, pairs, DPOConfig(steps=12, loss="slic", slic_delta=30.0), renderer.pad_id)
    assert expect > 0 and h[0]["train/loss"] == pytest.approx(expect, rel=1e-5)
    assert h[-1]["slic/margin"] > h[0]["slic/margin"]
    for variant in ("apo_zero", "apo_down"):  # step 1: the policy is the reference, both losses are exactly 0
        h = train_dpo(tiny_engine(renderer), pairs, DPOConfig(steps=12, loss=variant, beta=0.5), renderer.pad_id)
        assert h[0]["train/loss"] == pytest.approx(0.0, abs=1e-7)
        assert h[-1]["apo/margin"] > 0  # both variants push the rejected below the chosen
        assert all(is_documented(k) for row in h for k in row if k not in ("step", "time", "stage"))
    with pytest.raises(ValueError, match="nll_weight must be 0"):
        DPOConfig(loss="apo_zero", nll_weight=1.0)
    with pytest.raises(ValueError, match="label_smoothing must be 0"):
        DPOConfig(loss="slic", label_smoothing=0.1)
    from trajtune.cli import build_parser
    args = build_parser().parse_args(["dpo", "--model", "m", "--data", "d.jsonl", "--loss", "apo_down"])
    assert vars(args)["dpo.loss"] == "apo_down"
