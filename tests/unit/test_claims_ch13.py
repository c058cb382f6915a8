"""Every verdict of the chapter 13 report (B1-B7) is as strict as its claim and follows its numbers with their noise:
the seed's own numbers pass every check, each constructed failure makes its own check fail, and a difference inside
its standard errors is "not distinguishable" even where the headline numbers look like a win. No training here."""

import copy
import random

import pytest

from trajtune.experiments.chapter13.report import instruct_claims, preference_claims, rlvr_claims
from trajtune.runs.verdicts import NOISE

BETAS = (1.0, 0.3, 0.1)
N_PROBLEMS, K = 256, 16


def counts(p1: float, pk: float, n: int = N_PROBLEMS, k: int = K) -> list[int]:
    """Right samples (of k) per problem: a share pk of the problems solved at least once, p1 * n * k right in all."""
    solved, total = round(pk * n), round(p1 * n * k)
    base, extra = divmod(total, solved)
    assert base + (extra > 0) <= k
    return [base + (i < extra) for i in range(solved)] + [0] * (n - solved)


def with_mean(m: float, n: int = N_PROBLEMS) -> list[int]:
    """n integers with mean m (distinct answers per problem)."""
    low, above = int(m), round((m - int(m)) * n)
    return [low + 1] * above + [low] * (n - above)


def calculator(p1: float, pk: float, distinct: float, entropy: float = 0.2, seed: int = 0) -> dict:
    """A `rlvr.math_eval` result whose summary numbers are computed from its per-problem ones; each `seed` orders
    the problems its own way (two models differ problem by problem, as real ones do)."""
    c, d = counts(p1, pk), with_mean(distinct)
    random.Random(seed).shuffle(c)
    random.Random(seed + 100).shuffle(d)
    return {"pass_at": {"1": sum(c) / (K * N_PROBLEMS), str(K): sum(x > 0 for x in c) / N_PROBLEMS},
            "distinct": sum(d) / N_PROBLEMS, "entropy": entropy,
            "per_problem": {"greedy": [int(x > K // 2) for x in c], "correct": c, "distinct": d, "k": K}}


def windows(mean: float, shift: int = 0, n: int = 320) -> list[float]:
    """Per-window val losses with mean `mean` and a spread (sd ~0.18 nats); models with another `shift` differ
    window by window (a paired difference with a standard error, ~0.014 nats)."""
    return [mean + 0.25 * (((i + shift) % 5) - 2) / 2 for i in range(n)]


def instruct(seen, unseen, letter, val_loss, shift, **kw) -> dict:
    return {"seen": seen, "unseen": unseen, "unseen_letter": letter, "val_loss": val_loss, "n_seen": 128,
            "n_unseen": 32, "window_losses": windows(val_loss, shift), **kw}


def seed_like() -> dict:
    """REPRODUCE.md part B in the stages' result format."""
    dpo = {f"dpo_beta{b:g}": {"beta": b, "reward": r, "kl": kl, "kl_se": 0.05 * kl, "format": f, "end_share": e,
                              "end_share_se": 0.02, "n": 128}
           for b, r, kl, f, e in zip(BETAS, (0.62, 0.80, 0.81), (1.35, 5.7, 18.4), (0.92, 0.73, 0.32),
                                     (0.09, 0.05, 0.04), strict=True)}
    return {
        "pretrain": {"params": 345_000, **instruct(0.0, 0.0, 0.0, 1.78, 0)},
        "sft_narrow": {"n_words": 16, "n_demos": 2431, **instruct(0.95, 0.0, 0.0, 2.06, 1)},
        "sft_broad": {"n_words": 414, "n_demos": 2431, **instruct(0.41, 0.16, 0.81, 2.04, 2)},
        "reward_model": {"rm_accuracy": 1.0, "n_test_pairs": 64, "sft": {"reward": 0.27, "format": 0.95, "n": 128},
                         "best_of_n": {"2": {"reward": 0.38, "kl_bound": 0.19, "format": 0.95, "n": 64},
                                       "4": {"reward": 0.62, "kl_bound": 0.64, "format": 0.94, "n": 64},
                                       "8": {"reward": 0.88, "kl_bound": 1.20, "format": 0.94, "n": 64}}},
        **dpo,
        "coldstart": calculator(0.25, 0.84, 7.3, 0.23, seed=1),
        "grpo": {**calculator(0.47, 0.80, 4.3, 0.16, seed=2),
                 "curve": [(s, 0.4, 0.33 + 0.02 * (s % 3 - 1)) for s in range(10)]},
        "sft_control": calculator(0.75, 0.99, 3.0, seed=3),
    }


def verdicts(r) -> dict:
    cl = instruct_claims(r) + preference_claims(r, BETAS) + rlvr_claims(r)
    return {c.id: c.holds for c in cl}


def test_the_seeds_own_numbers_pass_every_check():
    got = verdicts(seed_like())
    assert got == {k: True for k in got} and len(got) == 13, got


def _dpo(beta, **kw):
    return lambda r: r[f"dpo_beta{beta:g}"].update(kw)


def _calc(stage, p1, pk, distinct):
    return lambda r: r[stage].update(calculator(p1, pk, distinct, seed={"grpo": 2, "sft_control": 3}[stage]))


FAILURES = {
    "B1": lambda r: r["pretrain"].update(seen=0.3),
    "B2a": lambda r: r["sft_narrow"].update(seen=0.35),
    "B2b": lambda r: r["sft_broad"].update(unseen_letter=0.1),
    "B2c": lambda r: r["sft_narrow"].update(window_losses=windows(1.80, 1)),  # +0.02 nats: not a raise worth the claim
    "B3": lambda r: r["reward_model"].update(rm_accuracy=0.8),
    "B4": lambda r: r["reward_model"]["best_of_n"]["8"].update(format=0.5),
    "B5a": _dpo(1.0, reward=0.95, kl=0.5),
    "B5b": _dpo(0.1, format=0.68),  # 96% -> 68%: the format bent, not broken (seed 32%)
    "B5c": _dpo(0.1, end_share=0.36),  # the change sits on the last two tokens
    "B6a": _calc("grpo", 0.25, 0.97, 4.3),  # pass@1 flat and pass@16 up
    "B6b": _calc("grpo", 0.47, 0.80, 8.5),
    "B6c": lambda r: r["grpo"].update(curve=[(s, 0.4, 0.05) for s in range(10)]),
    "B7": _calc("sft_control", 0.30, 0.99, 3.0),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_each_check_fails_on_a_constructed_failure(case):
    r = copy.deepcopy(seed_like())
    FAILURES[case](r)
    got = verdicts(r)
    assert got[case] is False, (case, got)
    assert all(v is True for k, v in got.items() if k != case), (case, got)


# A headline that reads as a win (a few points up) while the difference is inside its standard errors: the verdict
# follows the numbers' noise -- "not distinguishable", never "holds" (the earlier verdicts said holds on these).
INSIDE_THE_NOISE = {
    "B2a": lambda r: r["sft_broad"].update(seen=0.90),  # narrow 95% vs broad 90% of 128 replies
    "B2b": lambda r: r["sft_broad"].update(unseen_letter=0.40),  # +40 points on 32 replies against a 25-point margin
    "B2c": lambda r: r["sft_broad"].update(window_losses=windows(1.90, 2)),  # +0.12 nats against 0.1, 2 SE 0.03
    "B6a": _calc("grpo", 0.37, 0.80, 4.3),  # +12 points of pass@1 against a 10-point margin
    "B6b": _calc("grpo", 0.47, 0.80, 7.25),  # 7.3 -> 7.25 distinct answers
    "B7": _calc("sft_control", 0.49, 0.99, 3.0),  # 49% vs GRPO's 47%
}


@pytest.mark.parametrize("case", list(INSIDE_THE_NOISE))
def test_a_win_inside_the_noise_is_not_distinguishable(case):
    r = copy.deepcopy(seed_like())
    INSIDE_THE_NOISE[case](r)
    assert verdicts(r)[case] == NOISE, (case, verdicts(r))


def test_each_claim_shows_the_estimate_that_decided_it():
    r = seed_like()
    for c in instruct_claims(r) + preference_claims(r, BETAS) + rlvr_claims(r):
        assert c.estimate is not None and "2 SE" in c.evidence, c
        assert len(c.line()) <= 120
