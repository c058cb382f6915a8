"""Graders recipe, part evals (RLHF book ch.16), and the random-reward control function it trains with."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trajtune.algorithms.rl import RLConfig
from trajtune.experiments.graders import Config, run_with_results, stages
from trajtune.experiments.graders.evals import Demo, claims, pairwise_verdicts
from trajtune.runs.verdicts import NOISE
from trajtune.metrics import is_documented, read_metrics
from trajtune.sources.rewards import RewardState, load_reward_function, signature_of
from trajtune.sources.rewards.controls import random_reward


# --- the control reward ---------------------------------------------------------------------------------------
def test_random_reward_is_seeded_by_prompt_completion_and_step():
    prompts, completions = ["Q: 1+1\nA: "] * 400, [str(i) for i in range(400)]
    a = random_reward(prompts, completions, trainer_state=RewardState(3))
    assert a == random_reward(prompts, completions, trainer_state=RewardState(3))  # a rerun gets the same rewards
    assert set(a) == {0.0, 1.0} and 0.4 < sum(a) / len(a) < 0.6  # Bernoulli(1/2): 400 draws, sd 0.025
    b = random_reward(prompts, completions, trainer_state=RewardState(4))
    assert a != b and 0.3 < sum(x != y for x, y in zip(a, b)) / 400 < 0.7  # another step: fresh draws
    assert random_reward(prompts, completions) == random_reward(prompts, completions, trainer_state=RewardState(0))
    # conversational prompts and completions (lists of messages), extra columns ignored
    chat = random_reward([[{"role": "user", "content": "hi"}]], [[{"role": "assistant", "content": "yo"}]],
                         answer=["x"])
    assert chat in ([0.0], [1.0])


def test_random_reward_loads_as_the_grpo_command_names_it():
    fn = load_reward_function("trajtune.sources.rewards.controls:random_reward")
    assert fn is random_reward
    needed, accepted = signature_of(fn)
    assert needed == [] and accepted is None  # no dataset column needed; takes **kwargs


def test_grpo_command_accepts_the_random_reward(tmp_path, capsys):
    pytest.importorskip("transformers")
    from trajtune.cli import main
    from trajtune.models.hf_random import make_random_model

    model = make_random_model(tmp_path / "m", "llama", "tiny")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i}+{i}?"}) + "\n" for i in range(4)))
    rc = main(["grpo", "--model", str(model), "--data", str(data), "--reward",
               "trajtune.sources.rewards.controls:random_reward", "--out", str(tmp_path / "run"), "--dry-run"])
    assert rc == 0, capsys.readouterr()


# --- the claims' arithmetic -----------------------------------------------------------------------------------
def test_pairwise_verdicts_hand_values():
    v = pairwise_verdicts({"a": [[True, False]], "b": [[False, False]], "c": [[True, True]]})
    # sample 0: a right, b wrong, c right; sample 1: a wrong, b wrong, c right
    assert v == [("a", "b", 1.0), ("a", "c", 0.5), ("b", "c", 0.0), ("a", "b", 0.5), ("a", "c", 0.0), ("b", "c", 0.0)]


BEFORE = [0.25, 0.5, 0.25, 0.0] * 8
"""the cold start's per-problem pass rates (32 problems)"""


def fake_results(random_after: list[float], grpo_after: list[float] | None = None, tokens=(3.0, 3.0, 3.0),
                 letter=0.5, answer=0.75, maj_k=None, elo=None) -> dict:
    """The evals stage's results: three policies on 32 problems (maj_k: per-problem pass rates -> maj@4's)."""
    def policy(per_problem, tokens):
        p1 = sum(per_problem) / len(per_problem)
        maj = {"1": per_problem, "4": maj_k(per_problem) if maj_k is not None else per_problem}
        return {"pass_at": {"1": p1, "4": min(1.0, 2 * p1)},
                "maj_at": {j: sum(m) / len(m) for j, m in maj.items()}, "maj_per_problem": maj,
                "tokens": {"per_sample": tokens, "total": 0, "per_problem": [tokens] * len(per_problem)},
                "per_problem": per_problem,
                "mc": {"letter": letter, "answer_sum": answer, "answer_per_token": 0.6, "answer_per_char": 0.6}}

    grpo = grpo_after if grpo_after is not None else [p + 0.25 for p in BEFORE]
    ratings = elo or {"evals_grpo": 1100, "coldstart": 1000, "evals_random": 900}
    return {"evals": {"policies": {"coldstart": policy(BEFORE, tokens[0]), "evals_grpo": policy(grpo, tokens[1]),
                                   "evals_random": policy(random_after, tokens[2])},
                      "ratings": {"elo": ratings, "bt": {"evals_grpo": 1100, "coldstart": 1000, "evals_random": 900}},
                      "verdicts": {}, "decontamination": {"train_rows": 10, "eval_rows": 4, "clean_flagged": [],
                                                          "planted": ["1+1"], "planted_flagged": [2], "expected": [2],
                                                          "example": None}}}


def verdicts(results) -> dict:
    return {c.id: c.holds for c in claims(results, Config(demos=["evals"]))}


def test_claims_are_as_strict_as_the_sentences():
    ok = verdicts(fake_results([p - 0.0625 for p in BEFORE]))
    # E7: the label at 0.5 on 32 problems, the answer string 0.75 (24 of 32; 2 SE 0.15 at 25/34)
    assert ok == {"E1": True, "E2": True, "E3": True, "E4": True, "E5": True, "E6": True, "E7": True}
    # the random run rises by 0.125 on every problem: far beyond 2 SE -> the red flag is raised
    risen = verdicts(fake_results([p + 0.125 for p in BEFORE]))
    assert risen["E1"] is False and risen["E6"] is False  # and its rating (third) no longer matches pass@1 (second)
    assert claims({}, Config(demos=["evals"])) == []


def test_each_claim_follows_its_numbers_not_its_headline():
    """Each claim fed a table whose headline (a rise, a gap, an order) points one way by less than the noise of
    its own numbers, or whose numbers contradict the headline: the verdict follows the numbers."""
    noisy = [0.0] * 31 + [1.0]  # +1/32 on one problem: a rise of 0.03, paired SE 0.03
    # E1: the control 'rose' (0.25 -> 0.28) inside its noise: no red flag
    assert verdicts(fake_results([p + x for p, x in zip(BEFORE, noisy)]))["E1"] is True
    # E2: GRPO 'beats' the control by one problem: not distinguishable
    assert verdicts(fake_results(BEFORE, [p + x for p, x in zip(BEFORE, noisy)]))["E2"] == NOISE
    # E4: maj@4 'below' maj@1 on one problem of 32: not a drop beyond the noise; on every problem it is
    one_lower = lambda pp: [pp[0] - 0.25, *pp[1:]]  # noqa: E731
    assert verdicts(fake_results(BEFORE, maj_k=one_lower))["E4"] is True
    assert verdicts(fake_results(BEFORE, maj_k=lambda pp: [p - 0.25 for p in pp]))["E4"] is False
    # E5: a 12% spread of the means, but per problem the spread is the same 0.36 tokens: beyond 10% by 2 SE? no SE
    # here (identical problems): it does not hold; 9% holds
    assert verdicts(fake_results(BEFORE, tokens=(3.0, 3.36, 3.0)))["E5"] is False
    assert verdicts(fake_results(BEFORE, tokens=(3.0, 3.27, 3.0)))["E5"] is True
    # E6: Elo puts the control above the cold start, whose pass@1 it does not differ from beyond the noise: holds;
    # Elo puts the cold start above GRPO, 0.25 clear of it on pass@1: does not hold
    swapped = {"evals_grpo": 1100, "coldstart": 900, "evals_random": 1000}
    assert verdicts(fake_results([p + x for p, x in zip(BEFORE, noisy)], elo=swapped))["E6"] is True
    wrong = {"evals_grpo": 1000, "coldstart": 1100, "evals_random": 900}
    assert verdicts(fake_results([p - 0.0625 for p in BEFORE], elo=wrong))["E6"] is False
    # E6 with no two policies apart beyond the noise: not distinguishable
    assert verdicts(fake_results(BEFORE, BEFORE))["E6"] == NOISE
    # E7: the label at 0.59 (19 of 32) is 'above chance' by a headline, inside 2 SE; 0.75 is not chance
    assert verdicts(fake_results(BEFORE, letter=19 / 32))["E7"] is True
    assert verdicts(fake_results(BEFORE, letter=0.75))["E7"] is False
    # ... and the answer string at 0.62 (20 of 32) is not above chance beyond the noise
    assert verdicts(fake_results(BEFORE, answer=20 / 32))["E7"] == NOISE


# --- the part, end to end at a budget of seconds --------------------------------------------------------------
def tiny() -> Config:
    d = Config()
    return Config(demos=["evals"], runner=replace(d.runner, workers=1), calc_dim=32, calc_layers=1,
                  coldstart=replace(d.coldstart, steps=10),
                  evals=Demo(grpo=RLConfig(steps=3, tasks_per_step=4, group_size=4, advantage="grpo"), samples=4,
                             problems=16, planted=2))


def test_evals_part_end_to_end(tmp_path):
    config = tiny()
    assert [s.name for s in stages(config)] == ["coldstart", "evals_grpo", "evals_random", "evals"]
    report, results = run_with_results(config, tmp_path)
    text = report.read_text()
    for cid in ("E1", "E2", "E3", "E4", "E5", "E6", "E7"):
        assert f"| {cid} |" in text, cid
    for png in ("evals_pass1", "evals_training", "evals_ratings"):
        assert (tmp_path / f"{png}.png").exists() and f"({png}.png)" in text
    ev = results["evals"]
    assert set(ev["policies"]) == {"coldstart", "evals_grpo", "evals_random"}
    for p in ev["policies"].values():
        assert set(p["pass_at"]) == set(p["maj_at"]) == {"1", "4"} and len(p["per_problem"]) == 16
        assert set(p["mc"]) == {"letter", "answer_sum", "answer_per_token", "answer_per_char"}
        assert p["tokens"]["total"] == pytest.approx(p["tokens"]["per_sample"] * 16 * 4)
    d = ev["decontamination"]
    assert d["clean_flagged"] == [] and d["planted_flagged"] == d["expected"] and len(d["expected"]) >= 2
    assert sum(sum(c.values()) for c in ev["verdicts"].values()) == 3 * 16 * 4  # 3 pairs x problems x samples
    rows = read_metrics(tmp_path)
    control = [r for r in rows if r.get("stage") == "evals_random" and "rollout/reward" in r]
    assert len(control) == 3 and all("control/verifier_pass_rate" in r for r in control)
    assert all(is_documented(k) for r in rows for k in r if k not in ("step", "time", "stage"))
    part = text[text.index("## Evaluation (ch.16)"):text.index("## Time per stage")]
    assert "<" not in part and "| E1 |" in text  # no raw angle brackets in the markdown
