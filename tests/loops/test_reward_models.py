"""Reward models beyond pairs: ORM / PRM loops and aggregation, ranked lists (all pairs, Plackett-Luce), per-pair
margins, scoring only finished completions (RLHF book ch.5; checklist 0.4, 5.3-5.7)."""

import math

import pytest
import torch

from trajtune.algorithms.reward_model import (RewardModelConfig, bradley_terry_loss_fn, outcome_labels,
                                              process_labels, ranked_batch, ranked_loss_fn, token_batch,
                                              train_ranked_reward_model, train_reward_model,
                                              train_token_reward_model, with_prompt_weights)
from trajtune.engine import ForwardOutput, OptimConfig, make_engine
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.objectives.reward_model import IGNORE_INDEX, aggregate_scores, all_pairs_loss
from trajtune.sources.scoring import RewardKind, scorer, step_ends, token_reward_scores
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import pair_batch

TOK = CharTokenizer.from_corpus("Q: pickabcdef")
R = Renderer(TOK)


def engine(seed=0, lr=3e-3):
    torch.manual_seed(seed)
    model = TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=40, value_head=True))
    return make_engine(model, OptimConfig(lr=lr))


def demo(*replies):
    msgs = []
    for r in replies:
        msgs += [{"role": "user", "content": "Q: pick"}, {"role": "assistant", "content": r}]
    return R.render(msgs)


# --- pure functions, hand-worked ------------------------------------------------------------------
def test_aggregate_scores_by_hand():
    # p = sigma(0) = 0.5, sigma(ln 3) = 0.75 on the two marked positions; the third is not scored
    logits = torch.tensor([[0.0, math.log(3), 5.0], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert aggregate_scores(logits, mask, "mean")[0].item() == pytest.approx((0.5 + 0.75) / 2)  # 0.625
    assert aggregate_scores(logits, mask, "min")[0].item() == pytest.approx(0.5)
    assert aggregate_scores(logits, mask, "product")[0].item() == pytest.approx(math.log(0.5 * 0.75))  # log 0.375
    assert aggregate_scores(logits, mask, "last")[0].item() == pytest.approx(0.75)
    assert math.isnan(aggregate_scores(logits, mask, "mean")[1].item())  # nothing to aggregate
    with pytest.raises(ValueError, match="how must be one of"):
        aggregate_scores(logits, mask, "max")


def test_all_pairs_loss_by_hand():
    # rewards best-first [2, 1, 0]: pairs (0,1) diff 1, (0,2) diff 2, (1,2) diff 1
    loss, m = all_pairs_loss(torch.tensor([2.0, 1.0, 0.0]))
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731 softplus
    assert loss.item() == pytest.approx((2 * sp(-1) + sp(-2)) / 3)
    assert m["rm/accuracy"].item() == 1.0 and m["rm/margin"].item() == pytest.approx(4 / 3)
    loss, m = all_pairs_loss(torch.tensor([0.0, 1.0]))  # K = 2: one wrong pair, the BT loss ln(1 + e)
    assert loss.item() == pytest.approx(math.log1p(math.e)) and m["rm/accuracy"].item() == 0.0
    with pytest.raises(ValueError, match="K >= 2"):
        all_pairs_loss(torch.tensor([1.0]))


def test_ranked_loss_averages_prompts_whatever_their_k():
    # two prompts: K = 3 with last-token rewards [2, 1, 0] (best first) and K = 2 with [0, 1] (wrong order)
    groups = [[demo("a"), demo("b"), demo("c")], [demo("a"), demo("b")]]
    batch = ranked_batch(groups, TOK.pad_id)
    last = batch.attention_mask.sum(-1) - 1
    values = torch.zeros(batch.ids.shape)
    values[torch.arange(5), last] = torch.tensor([2.0, 1.0, 0.0, 0.0, 1.0])
    with_prompt_weights(batch)  # b / (p * K): 5 / (2 * 3) on the first list's rows, 5 / (2 * 2) on the second's
    assert batch.extras["weight"].tolist() == pytest.approx([5 / 6] * 3 + [5 / 4] * 2)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    bt = ranked_loss_fn(RewardModelConfig(objective="bt"))
    loss, m = bt(ForwardOutput(logprobs=torch.zeros(5, batch.ids.shape[1] - 1), values=values), batch)
    assert loss.item() == pytest.approx(((2 * sp(-1) + sp(-2)) / 3 + sp(1)) / 2)  # mean over the 2 prompts
    assert m["rm/accuracy"].item() == pytest.approx((1 + 0) / 2) and m["rm/top1_accuracy"].item() == 0.5
    # Plackett-Luce of [2, 1, 0]: -log(e^2/(e^2+e+1)) - log(e/(e+1)) ; of [0, 1]: -log(1/(1+e))
    pl = ranked_loss_fn(RewardModelConfig(objective="plackett-luce"))
    loss, _ = pl(ForwardOutput(logprobs=torch.zeros(5, batch.ids.shape[1] - 1), values=values), batch)
    first = -math.log(math.e**2 / (math.e**2 + math.e + 1)) - math.log(math.e / (math.e + 1))
    assert loss.item() == pytest.approx((first + math.log1p(math.e)) / 2)


def test_per_pair_margin_replaces_the_configured_one():
    chosen, rejected = demo("a"), demo("b")
    chosen.info["margin"] = 3.0  # a 'margin' column: Likert 5 vs 2 (Llama 2)
    pairs = [(chosen, rejected), (demo("a"), demo("c"))]
    batch = pair_batch(pairs, TOK.pad_id)
    batch.extras["margin"] = torch.tensor([3.0, 0.5, 3.0, 0.5])  # as train_reward_model sets it, [2P]
    last = batch.attention_mask.sum(-1) - 1
    values = torch.zeros(batch.ids.shape)
    values[torch.arange(4), last] = torch.tensor([1.0, 1.0, 0.0, 0.0])  # r_c - r_r = 1 for both pairs
    loss, m = bradley_terry_loss_fn(RewardModelConfig(margin=0.5))(
        ForwardOutput(logprobs=torch.zeros(4, batch.ids.shape[1] - 1), values=values), batch)
    # softplus(-(1 - 3)) = ln(1 + e^2) and softplus(-(1 - 0.5)) = ln(1 + e^-0.5), averaged
    assert loss.item() == pytest.approx((math.log1p(math.e**2) + math.log1p(math.exp(-0.5))) / 2)
    assert m["rm/margin"].item() == pytest.approx(1.0)  # the logged margin is r_c - r_r, without m


def test_labels_sit_on_the_completion_and_on_step_ends():
    t = demo("ab", "c")  # two policy turns: 'a' 'b' <|end|>, then 'c' <|end|>
    ends = step_ends(t)
    policy = [i for i, o in enumerate(t.owners) if o == 2]
    assert ends == [policy[2], policy[4]]  # the <|end|> of each turn
    y = process_labels(t, [1, 0])
    assert [y[i] for i in ends] == [1, 0] and sum(v != IGNORE_INDEX for v in y) == 2
    o = outcome_labels(t, True)
    assert [i for i, v in enumerate(o) if v != IGNORE_INDEX] == policy and set(o[i] for i in policy) == {1}
    with pytest.raises(ValueError, match="1 labels for 2 steps"):
        process_labels(t, [1])
    batch = token_batch([(t, y)], TOK.pad_id)
    assert batch.extras["token_labels"].shape == (1, len(t) - 1)
    assert batch.extras["token_labels"][0, ends[0] - 1].item() == 1  # shifted: position i -> column i - 1


# --- loops on a tiny model ------------------------------------------------------------------------
def test_orm_learns_correct_from_wrong_and_scores_by_aggregate():
    e = engine()
    data = [(demo("a"), 1), (demo("b"), 0), (demo("c"), 0), (demo("ab"), 1)]
    hist = train_token_reward_model(e, [(t, outcome_labels(t, y)) for t, y in data],
                                    RewardModelConfig(steps=40, batch_size=4, objective="orm"), TOK.pad_id)
    assert hist[-1]["train/loss"] < hist[0]["train/loss"] and hist[-1]["orm/accuracy"] == 1.0
    for how in ("mean", "min", "product", "last"):
        s = token_reward_scores(e, [t for t, _ in data], TOK.pad_id, "orm", how)
        assert min(s[0], s[3]) > max(s[1], s[2]), how
    assert scorer(e, RewardKind("orm", "min"), TOK.pad_id)([demo("a")]) == pytest.approx(
        token_reward_scores(e, [demo("a")], TOK.pad_id, "orm", "min"))


def test_prm_scores_each_step():
    e = engine()
    good, bad = demo("a", "a"), demo("a", "b")  # step 2 is wrong in `bad`
    examples = [(good, process_labels(good, [1, 1])), (bad, process_labels(bad, [1, 0]))]
    hist = train_token_reward_model(e, examples, RewardModelConfig(steps=40, batch_size=2, objective="prm"),
                                    TOK.pad_id)
    assert hist[-1]["prm/accuracy"] == 1.0 and hist[-1]["prm/steps"] == 4.0
    g_min, b_min = token_reward_scores(e, [good, bad], TOK.pad_id, "prm", "min")
    assert g_min > 0.5 > b_min  # the bad episode's weakest step is flagged


def test_ranked_lists_train_with_both_objectives():
    groups = [[demo("a"), demo("b"), demo("c")], [demo("a"), demo("d")]]
    for objective in ("bt", "plackett-luce"):
        hist = train_ranked_reward_model(engine(), groups, RewardModelConfig(steps=30, batch_size=2,
                                         objective=objective), TOK.pad_id)
        assert hist[-1]["rm/top1_accuracy"] == 1.0 and hist[-1]["rm/margin"] > hist[0]["rm/margin"], objective
    with pytest.raises(ValueError, match=">= 2 completions"):
        train_ranked_reward_model(engine(), [[demo("a")]], RewardModelConfig(), TOK.pad_id)


def test_pair_margins_reach_the_loop():
    c = demo("a")
    c.info["margin"] = 2.0
    hist = train_reward_model(engine(), [(c, demo("b")), (demo("a"), demo("c"))],
                              RewardModelConfig(steps=2, batch_size=2), TOK.pad_id)
    # at step 1 an untrained head has r_c ~ r_r: the pair with margin 2 has loss ~ softplus(2) > ln 2
    assert hist[0]["train/loss"] > (math.log1p(math.exp(2)) + math.log(2)) / 2 - 0.2


# --- data formats (a trained HF tokenizer, its chat template) ---------------------------------------
@pytest.fixture(scope="module")
def chat():
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import train_tokenizer
    from trajtune.text.chat import ChatRenderer

    return ChatRenderer(train_tokenizer())


def _rows(tmp_path, rows):
    import json

    from trajtune.sources import data as D

    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return D.read_rows(p)


def test_margin_and_category_columns(chat, tmp_path):
    from trajtune.sources import data as D

    rows = _rows(tmp_path, [{"prompt": "2+3?", "chosen": "5", "rejected": "6", "margin": 3, "category": "math"},
                            {"prompt": "2+3?", "chosen": "5", "rejected": "7"}])
    (c1, _), (c2, _) = D.preference_pairs(rows, chat)
    assert c1.info["margin"] == 3.0 and c1.info["category"] == "math" and "margin" not in c2.info
    for bad, msg in [({"margin": -1}, "'margin' must be >= 0"), ({"margin": "big"}, "'margin' must be a finite"),
                     ({"category": 3}, "'category' must be a non-empty string")]:
        rows = _rows(tmp_path, [{"prompt": "2+3?", "chosen": "5", "rejected": "6", **bad}])
        with pytest.raises(D.DataError, match=f"d.jsonl:1: field {msg}"):
            D.preference_pairs(rows, chat)


def test_ranked_rows_best_first_or_by_scores(chat, tmp_path):
    from trajtune.sources import data as D, reward_data as RD

    rows = _rows(tmp_path, [{"prompt": "2+3?", "completions": ["5", "6", "7"]},
                            {"prompt": "2+3?", "completions": ["7", "5", "6"], "scores": [1, 9, 4]},
                            {"prompt": "2+3?", "chosen": "5", "rejected": "6"}])
    a, b, c = RD.ranked_lists(rows, chat)
    assert [t.ids for t in a] == [t.ids for t in b] and len(c) == 2 and c[0].ids == a[0].ids
    for bad, msg in [({"completions": ["5"]}, "at least 2 completions"),
                     ({"completions": ["5", "6"], "scores": [1]}, "'scores' must be a list of 2 numbers"),
                     ({"completions": ["5", "6"], "scores": [1, None]}, r"'scores'\[1\] must be a finite number")]:
        with pytest.raises(D.DataError, match=msg):
            RD.ranked_lists(_rows(tmp_path, [{"prompt": "2+3?", **bad}]), chat)


def test_labelled_rows_for_an_orm(chat, tmp_path):
    from trajtune.sources import data as D, reward_data as RD

    (t, y), (_, n) = RD.labelled_examples(_rows(tmp_path, [{"prompt": "2+3?", "completion": "5", "label": True},
                                                          {"prompt": "2+3?", "completion": "6", "label": 0}]), chat)
    assert (y, n) == (1, 0) and t.tokens_of(2)
    for bad, msg in [({}, "missing field 'label'"), ({"label": 2}, "'label' must be 0, 1, true or false")]:
        with pytest.raises(D.DataError, match=f"d.jsonl:1: .*{msg}"):
            RD.labelled_examples(_rows(tmp_path, [{"prompt": "2+3?", "completion": "5", **bad}]), chat)


def test_stepwise_rows_put_each_label_on_its_steps_last_token(chat, tmp_path):
    from trajtune.sources import data as D, reward_data as RD

    rows = _rows(tmp_path, [{"prompt": "2+3+4?", "completions": ["2+3=5", "5+4=9"], "labels": [True, False]}])
    [(t, y)] = RD.stepwise_examples(rows, chat, "\n")
    assert y == [1, 0]
    first, last = t.info["step_ends"]
    policy = [i for i, o in enumerate(t.owners) if o == 2]
    assert last == policy[-1]  # the last step ends with the turn
    # the first step ends on the separator after "2+3=5": everything up to it decodes to that text
    assert chat.tokenizer.decode(t.ids[policy[0] : first + 1]) == "2+3=5\n"
    for bad, msg in [({"labels": [1]}, "'labels' must be a list of 2 labels"),
                     ({"labels": [1, "yes"]}, r"'labels'\[1\] must be 0, 1"),
                     ({"completions": ["2+3=5\n", "x"], "labels": [1, 1]}, "contains the step separator")]:
        row = {"prompt": "2+3+4?", "completions": ["2+3=5", "5+4=9"], "labels": [1, 0], **bad}
        with pytest.raises(D.DataError, match=msg):
            RD.stepwise_examples(_rows(tmp_path, [row]), chat, "\n")


def test_orm_sequence_form_is_the_sigmoid_of_the_mean_logit():
    """Lyu et al.'s ORM (checklist 5.6): BCE of sigma(mean logit), not of the mean probability."""
    import math

    import torch

    from trajtune.algorithms.reward_model import RewardModelConfig, token_loss_fn
    from trajtune.objectives.reward_model import orm_sequence_loss

    logits = torch.tensor([[9.0, 2.0, -2.0, 0.0], [5.0, 1.0, 3.0, 0.0]])
    labels = torch.tensor([[-100, 1, 1, -100], [-100, 0, 0, 0]])
    loss, m = orm_sequence_loss(logits, labels)
    # row 0: mean logit 0, label 1 -> log 2; row 1: mean logit 4/3, label 0 -> softplus(4/3); the mean of the two
    assert loss.item() == pytest.approx((math.log(2) + math.log1p(math.exp(4 / 3))) / 2, rel=1e-6)
    assert m["orm/sequences"].item() == 2 and m["orm/accuracy"].item() == 0.0  # 0 is not > 0; 4/3 > 0 says correct
    empty, _ = orm_sequence_loss(logits, torch.full_like(labels, -100))
    assert empty.item() == 0.0
    with pytest.raises(ValueError, match="orm_form"):
        RewardModelConfig(objective="orm", orm_form="mean")
    assert token_loss_fn(RewardModelConfig(objective="orm", orm_form="sequence")).normalizer == "sequence"
