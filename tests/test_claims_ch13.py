"""Every verdict of the chapter 13 report (B1-B7) is as strict as its claim: the seed's own numbers
pass every check, and each constructed failure makes its own check fail. No training here."""

import copy

import pytest

from trajtune.experiments.chapter13.report import instruct_claims, preference_claims, rlvr_claims

BETAS = (1.0, 0.3, 0.1)


def seed_like() -> dict:
    """REPRODUCE.md part B in the stages' result format."""
    dpo = {f"dpo_beta{b:g}": {"beta": b, "reward": r, "kl": kl, "format": f, "end_share": e}
           for b, r, kl, f, e in zip(BETAS, (0.62, 0.80, 0.81), (1.35, 5.7, 18.4), (0.92, 0.73, 0.32), (0.09, 0.05, 0.04),
                                     strict=True)}
    return {
        "pretrain": {"params": 345_000, "val_loss": 1.78, "seen": 0.0, "unseen": 0.0, "unseen_letter": 0.0},
        "sft_narrow": {"n_words": 16, "n_demos": 2431, "seen": 0.95, "unseen": 0.0, "unseen_letter": 0.0, "val_loss": 2.06},
        "sft_broad": {"n_words": 414, "n_demos": 2431, "seen": 0.41, "unseen": 0.16, "unseen_letter": 0.81, "val_loss": 2.04},
        "reward_model": {"rm_accuracy": 1.0, "sft": {"reward": 0.27, "format": 0.95},
                         "best_of_n": {"2": {"reward": 0.38, "kl_bound": 0.19, "format": 0.95},
                                       "4": {"reward": 0.62, "kl_bound": 0.64, "format": 0.94},
                                       "8": {"reward": 0.88, "kl_bound": 1.20, "format": 0.94}}},
        **dpo,
        "coldstart": {"pass_at": {"1": 0.25, "16": 0.84}, "distinct": 7.3, "entropy": 0.23},
        "grpo": {"pass_at": {"1": 0.47, "16": 0.80}, "distinct": 4.3, "entropy": 0.16,
                 "curve": [(s, 0.4, 0.33) for s in range(10)]},
        "sft_control": {"pass_at": {"1": 0.75, "16": 0.99}},
    }


def verdicts(r) -> dict:
    cl = instruct_claims(r) + preference_claims(r, BETAS) + rlvr_claims(r)
    return {c.id: c.holds for c in cl}


def test_the_seeds_own_numbers_pass_every_check():
    got = verdicts(seed_like())
    assert got == {k: True for k in got} and len(got) == 13, got


def _dpo(beta, **kw):
    return lambda r: r[f"dpo_beta{beta:g}"].update(kw)


FAILURES = {
    "B1": lambda r: r["pretrain"].update(seen=0.3),
    "B2a": lambda r: r["sft_narrow"].update(seen=0.35),
    "B2b": lambda r: r["sft_broad"].update(unseen_letter=0.1),
    "B2c": lambda r: r["sft_narrow"].update(val_loss=1.80),  # +0.02 nats: not a raise worth the claim
    "B3": lambda r: r["reward_model"].update(rm_accuracy=0.9),
    "B4": lambda r: r["reward_model"]["best_of_n"]["8"].update(format=0.5),
    "B5a": _dpo(1.0, reward=0.95, kl=0.5),
    "B5b": _dpo(0.1, format=0.68),  # 96% -> 68%: the format bent, not broken (seed 32%)
    "B5c": _dpo(0.1, end_share=0.36),  # the change sits on the last two tokens
    "B6a": lambda r: r["grpo"]["pass_at"].update({"1": 0.30}),  # +5 points only
    "B6b": lambda r: r["grpo"].update(distinct=8.0),
    "B6c": lambda r: r["grpo"].update(curve=[(s, 0.4, 0.05) for s in range(10)]),
    "B7": lambda r: r["sft_control"]["pass_at"].update({"1": 0.40}),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_each_check_fails_on_a_constructed_failure(case):
    r = copy.deepcopy(seed_like())
    FAILURES[case](r)
    got = verdicts(r)
    assert got[case] is False, (case, got)
    assert all(v for k, v in got.items() if k != case), (case, got)
