"""RLHF book ch.16 evaluation tools: maj@k, multiple choice by conditional log-likelihood, Elo and
Bradley-Terry ratings from pairwise verdicts, the token budget of an evaluation. Hand-worked values."""

import math

import pytest
import torch

from trajtune.engine import ForwardOutput, make_engine
from trajtune.evaluation import (
    MultipleChoice,
    continuation_logprobs,
    generated_tokens,
    maj_at_k,
    majority_answer,
    multiple_choice_scores,
    score_multiple_choice,
    score_trajectories,
)
from trajtune.logprobs import token_log_probs
from trajtune.ratings import bradley_terry_ratings, elo_ratings
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner, Trajectory, collate


# --- maj@k ----------------------------------------------------------------------------------------------------
def test_majority_answer_tie_rule_and_unparsable():
    assert majority_answer(["7", "5", "5", "7"]) == "7"  # 2 votes each: "7" came first
    assert majority_answer(["5", "7", "7", "5"]) == "5"
    assert majority_answer(["1", "2", "2"]) == "2"
    assert majority_answer([None, None, "3"]) == "3"  # unparsable never wins while anything parses
    assert majority_answer([None, None]) is None
    with pytest.raises(ValueError):
        majority_answer([])


def test_maj_at_k_hand_values_over_disjoint_blocks():
    answers = [["1", "2", "1", "3", "3", "3"],   # task 0, reference "1"
               ["9", "9", "9", "9", "8", "8"]]   # task 1, reference "8"
    refs = ["1", "8"]
    # k=1: six blocks of one -> task 0: 2/6 right, task 1: 2/6 right -> 1/3
    assert maj_at_k(answers, refs, 1) == pytest.approx((2 / 6 + 2 / 6) / 2)
    # k=3: blocks [1,2,1] -> 1 (right), [3,3,3] -> 3 (wrong): 1/2; [9,9,9] wrong, [9,8,8] -> 8 right: 1/2
    assert maj_at_k(answers, refs, 3) == pytest.approx(0.5)
    # k=4: one block each (2 samples unused): [1,2,1,3] -> 1 right; [9,9,9,9] wrong -> 1/2
    assert maj_at_k(answers, refs, 4) == pytest.approx(0.5)
    # k=2: [1,2] tie -> 1 (first) right, [1,3] tie -> 1 right, [3,3] wrong: 2/3; [9,9] [9,9] wrong, [8,8] right: 1/3
    assert maj_at_k(answers, refs, 2) == pytest.approx((2 / 3 + 1 / 3) / 2)
    with pytest.raises(ValueError, match="fewer than k=7"):
        maj_at_k(answers, refs, 7)
    with pytest.raises(ValueError, match="references"):
        maj_at_k(answers, ["1"], 1)


# --- ratings --------------------------------------------------------------------------------------------------
def test_elo_hand_values_and_fixed_order():
    # game 1: equal ratings, E = 0.5: a 1000 + 32 * 0.5 = 1016, b 984
    # game 2: b wins; E_b = 1 / (1 + 10^((1016 - 984) / 400)) = 1 / (1 + 10^0.08) = 0.454078
    #         b = 984 + 32 * (1 - 0.454078) = 1001.4695, a = 1016 - 17.4695 = 998.5305
    r = elo_ratings([("a", "b", 1), ("b", "a", 1)])
    assert r["a"] == pytest.approx(998.5305, abs=1e-3) and r["b"] == pytest.approx(1001.4695, abs=1e-3)
    # a tie between equals moves nothing; the sum of ratings is kept
    assert elo_ratings([("a", "b", 0.5)]) == {"a": 1000.0, "b": 1000.0}
    games = [("a", "b", 1), ("b", "c", 1), ("c", "a", 0.5), ("a", "c", 1), ("b", "a", 0)] * 3
    assert elo_ratings(games, seed=1) == elo_ratings(games, seed=1)  # a seeded order reruns the same
    assert sum(elo_ratings(games, seed=2).values()) == pytest.approx(3000.0)
    with pytest.raises(ValueError, match="verdict 0"):
        elo_ratings([("a", "a", 1)])
    with pytest.raises(ValueError, match="verdict 1"):
        elo_ratings([("a", "b", 1), ("a", "b", 2)])


def test_bradley_terry_maximum_likelihood_hand_values():
    # a beat b 3 times, b beat a once: the MLE has p_a / p_b = 3 -> a gap of 400 log10(3) = 190.85
    r = bradley_terry_ratings([("a", "b", 1)] * 3 + [("b", "a", 1)])
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(3), abs=1e-6)
    assert r["a"] + r["b"] == pytest.approx(2000.0)  # geometric mean of strengths 1 -> mean rating 1000
    # ties are half wins: a 2 wins + 2 ties vs b 0 wins + 2 ties -> W_a = 3, W_b = 1: the same 3:1
    r2 = bradley_terry_ratings([("a", "b", 1), ("a", "b", 1), ("a", "b", 0.5), ("b", "a", 0.5)])
    assert r2["a"] - r2["b"] == pytest.approx(400 * math.log10(3), abs=1e-6)
    # three players, each pair once each way, plus a beat c once more: the likelihood equations
    # W_i = sum_j n_ij p_i / (p_i + p_j) hold at the fit
    games = [("a", "b", 1), ("b", "a", 1), ("b", "c", 1), ("c", "b", 1), ("a", "c", 1), ("c", "a", 1), ("a", "c", 1)]
    r3 = bradley_terry_ratings(games)
    p = {k: 10 ** ((v - 1000) / 400) for k, v in r3.items()}
    wins = {"a": 3, "b": 2, "c": 2}
    n = {("a", "b"): 2, ("b", "c"): 2, ("a", "c"): 3}
    for i in p:
        expected = sum(m * p[i] / (p[i] + p[j]) for (x, y), m in n.items() for j in [y if x == i else x] if i in (x, y))
        assert expected == pytest.approx(wins[i], abs=1e-8)
    assert r3["a"] > r3["b"] and r3["b"] > r3["c"]  # c lost the extra game to a, not to b
    # order-free, unlike Elo
    assert bradley_terry_ratings(list(reversed(games))) == pytest.approx(r3)


def test_bradley_terry_needs_a_prior_when_someone_never_lost():
    with pytest.raises(ValueError, match=r"\['a', 'b'\] never won or never lost"):
        bradley_terry_ratings([("a", "b", 1)])
    # prior 1: one tied pseudo-game per pair -> W_a = 1.5, W_b = 0.5: 3:1 again
    r = bradley_terry_ratings([("a", "b", 1)], prior=1.0)
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(3), abs=1e-6)


# --- multiple choice ------------------------------------------------------------------------------------------
class TableEngine:
    """A model whose log-probs we set: log pi(token) = table[token], whatever the context."""

    def __init__(self, table: dict[int, float]):
        self.table = table

    def forward(self, batch, positions="all", **kw):
        nxt = batch.ids[:, 1:]  # [B, T-1]
        logp = torch.tensor([[self.table.get(int(i), -20.0) for i in row] for row in nxt])
        return ForwardOutput(logp, None, None, None)


def test_multiple_choice_letter_vs_answer_string_on_a_model_we_control():
    tok = CharTokenizer(sorted(set("ABCabcdxyz?() \n")))
    r = Renderer(tok)
    t = tok.encode
    # letters: log p(A) = -0.2, log p(B) = -3; answer characters: a = b = -1, c = -1.5
    engine = TableEngine({t("A")[0]: -0.2, t("B")[0]: -3.0, t("a")[0]: -1.0, t("b")[0]: -1.0, t("c")[0]: -1.5})
    item = MultipleChoice("xyz?", ("ab", "c"), answer=0)
    s = multiple_choice_scores(engine, r, item)
    assert s["letter"].tolist() == pytest.approx([-0.2, -3.0])                 # picks A: right
    assert s["answer_sum"].tolist() == pytest.approx([-2.0, -1.5])             # -1 + -1 vs -1.5: picks "c": wrong
    assert s["answer_per_token"].tolist() == pytest.approx([-1.0, -1.5])       # -2/2 vs -1.5/1: picks "ab": right
    assert s["answer_per_char"].tolist() == pytest.approx([-1.0, -1.5])        # char tokenizer: chars = tokens
    acc = score_multiple_choice(engine, r, [item, MultipleChoice("xyz?", ("c", "ab"), answer=0)])
    # item 2 (answer "c"): letter picks A = "c" right; sum picks "c" right; per token picks "ab" wrong
    assert acc == {"letter": 1.0, "answer_sum": 0.5, "answer_per_token": 0.5, "answer_per_char": 0.5}
    with pytest.raises(ValueError, match="answer index 2"):
        MultipleChoice("q", ("a", "b"), answer=2)
    assert item.prompt() == "xyz?\n(A) ab\n(B) c" and item.prompt(list_choices=False) == "xyz?"
    assert MultipleChoice("q", ("7", "8"), 0, labels="12", line="{label}: {choice}").prompt() == "q\n1: 7\n2: 8"
    with pytest.raises(ValueError, match="repeat"):
        MultipleChoice("q", ("7", "8"), 0, labels="11")


def test_continuation_logprobs_sum_the_content_tokens_of_a_real_model():
    """The tiny model: the function's sums equal log_softmax of a plain forward over the content tokens
    (the stop token left out)."""
    tok = CharTokenizer(sorted(set("ABCabcxyz? \n()")))
    r = Renderer(tok)
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(tok.vocab_size, 16, 1, 2, max_len=64))
    engine = make_engine(model)
    logp, n_tok = continuation_logprobs(engine, r, "xyz?", ["ab", "c"])
    assert n_tok.tolist() == [2, 1]
    for text, got in zip(["ab", "c"], logp.tolist(), strict=True):
        traj = r.render([{"role": "user", "content": "xyz?"}, {"role": "assistant", "content": text}])
        ids = torch.tensor([traj.ids])
        with torch.no_grad():
            per_tok = token_log_probs(model(ids), ids)[0]  # [T-1]
        content = [i - 1 for i, o in enumerate(traj.owners) if o == Owner.POLICY][:-1]  # the last is <|end|>
        assert got == pytest.approx(float(per_tok[content].sum()), abs=1e-5)


def test_continuation_logprobs_on_a_hugging_face_model(tmp_path):
    pytest.importorskip("transformers")
    from trajtune.models.hf import load_policy
    from trajtune.models.hf_random import make_random_model
    from trajtune.text.chat import ChatRenderer
    from trajtune.models.hf import load_tokenizer

    path = make_random_model(tmp_path / "m", "llama", "tiny")
    policy = load_policy(path).eval()
    r = ChatRenderer(load_tokenizer(path))
    engine = make_engine(policy)
    item = MultipleChoice("Which is a colour?", ("red", "seven", "table"), answer=0)
    scores = multiple_choice_scores(engine, r, item)
    assert set(scores) == {"letter", "answer_sum", "answer_per_token", "answer_per_char"}
    assert all(s.shape == (3,) and torch.isfinite(s).all() and (s < 0).all() for s in scores.values())
    logp, n_tok = continuation_logprobs(engine, r, item.prompt(False), list(item.choices))
    traj = r.render([{"role": "user", "content": item.prompt(False)}, {"role": "assistant", "content": "red"}])
    stop = set(r.stop_ids)
    policy_pos = [i for i, o in enumerate(traj.owners) if o == Owner.POLICY]
    content = [i for i in policy_pos if i < next(j for j in policy_pos if traj.ids[j] in stop)]
    ids = torch.tensor([traj.ids])
    with torch.no_grad():
        per_tok = token_log_probs(policy(ids), ids)[0]
    assert n_tok[0] == len(content)
    assert float(logp[0]) == pytest.approx(float(per_tok[[i - 1 for i in content]].sum()), abs=1e-4)


# --- token budget ---------------------------------------------------------------------------------------------
def test_token_budget_counts_generated_policy_tokens():
    def ep(group, reward, n_policy):
        t = Trajectory(reward=reward, group=group, info={"task": f"t{group}"})
        t.append([1, 2, 3], Owner.PROMPT, 0)
        t.append([4] * n_policy, Owner.POLICY, 0)
        return t

    trajs = [ep(0, 1.0, 2), ep(0, 0.0, 4), ep(1, 1.0, 3), ep(1, 1.0, 3)]
    assert generated_tokens(trajs) == 2 + 4 + 3 + 3
    score = score_trajectories(trajs, ks=(1,))
    assert score.tokens == 12 and score.tokens_per_sample == pytest.approx(12 / 4)
    m = score.metrics()
    assert m["eval/tokens_total"] == 12.0 and m["eval/tokens_per_sample"] == 3.0
    assert score.pass_at[1] == pytest.approx((0.5 + 1.0) / 2)  # the other numbers as before
    batch = collate(trajs, 0)
    assert int(batch.action_mask.sum()) == 12  # the same tokens the loss would train on


def test_chapter13_math_eval_reports_its_token_budget():
    from trajtune.envs.arithmetic import N_TEST, arithmetic_tokenizer
    from trajtune.experiments.shared.calculator import MAX_ANSWER, math_eval

    tok = arithmetic_tokenizer()
    torch.manual_seed(0)
    engine = make_engine(TinyTransformer(TinyConfig(tok.vocab_size, 16, 1, 2, max_len=32)))
    out = math_eval(engine, Renderer(tok), 2, seed=0)
    assert set(out) == {"greedy", "pass_at", "distinct", "entropy", "tokens", "per_problem"}
    per = out["per_problem"]  # one number per held-out problem: what a paired verdict needs
    assert len(per["correct"]) == len(per["greedy"]) == len(per["distinct"]) == N_TEST and per["k"] == 2
    assert sum(per["greedy"]) / N_TEST == pytest.approx(out["greedy"])
    for name, n in (("greedy", N_TEST), ("sampled", 2 * N_TEST)):
        t = out["tokens"][name]
        assert t["per_sample"] == pytest.approx(t["total"] / n) and 1 <= t["per_sample"] <= MAX_ANSWER
