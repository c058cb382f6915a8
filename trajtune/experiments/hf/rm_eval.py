"""`trajtune rm-eval --model DIR --data FILE`: a reward model on held-out preference pairs, without training
(RLHF book ch.5 "RM evaluation", Suggested Experiment S5.3: a 50-200-example eval small enough to run during
hyperparameter tuning; RewardBench-style pair accuracy).

    trajtune rm-eval --model runs/rm/model --data heldout.jsonl

prints the pairs' accuracy (the share with r_chosen > r_rejected; ties count as wrong), the mean margin
r_chosen - r_rejected and, where rows carry a 'category' column, the same per category. The model is one
saved by `trajtune rm` (any objective: a Bradley-Terry model scores at the last token, an ORM / PRM by the
aggregation it was saved with, `reward_model.json`). `pair_report` is the pure part, used by the graders
recipe on the built-in gyms too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from ...config import ConfigError

KIND_FILE = "reward_model.json"
"""beside a reward model's weights: its objective, aggregation and step separator (`trajtune rm` writes it)"""


def pair_report(chosen: Sequence[float], rejected: Sequence[float],
                categories: Sequence[str | None] | None = None) -> dict:
    """Pair accuracy and mean margin of scored pairs, overall and per category.

    chosen[i], rejected[i]: the scores of pair i's sides; categories[i]: its category or None.
    -> {"n", "accuracy", "margin", "categories": {name: {"n", "accuracy", "margin"}}} (categories sorted)."""
    if len(chosen) != len(rejected) or not chosen:
        raise ValueError(f"pair_report: {len(chosen)} chosen and {len(rejected)} rejected scores (need >= 1 pair each)")
    cats = list(categories) if categories is not None else [None] * len(chosen)
    if len(cats) != len(chosen):
        raise ValueError(f"pair_report: {len(cats)} categories for {len(chosen)} pairs")

    def summary(rows: list[int]) -> dict:
        return {"n": len(rows), "accuracy": sum(chosen[i] > rejected[i] for i in rows) / len(rows),
                "margin": sum(chosen[i] - rejected[i] for i in rows) / len(rows)}

    out = summary(list(range(len(chosen))))
    out["categories"] = {c: summary([i for i, x in enumerate(cats) if x == c])
                         for c in sorted({c for c in cats if c is not None})}
    return out


def evaluate_pairs(score: Callable[[list], list[float]], pairs: Sequence[tuple]) -> dict:
    """`pair_report` of (chosen, rejected) trajectories scored by `score` (trajs -> floats); a pair's category
    is its chosen side's info['category'] (the row's 'category' column)."""
    scores = score([c for c, _ in pairs] + [r for _, r in pairs])
    P = len(pairs)
    return pair_report(scores[:P], scores[P:], [c.info.get("category") for c, _ in pairs])


def format_report(report: dict, digits: int = 3) -> str:
    """The report as the lines rm-eval prints."""
    lines = [f"pairs {report['n']}  accuracy {report['accuracy']:.{digits}f}  "
             f"mean margin {report['margin']:.{digits}f}"]
    if report["categories"]:
        width = max(len("category"), *(len(c) for c in report["categories"]))
        lines.append(f"{'category':<{width}}  {'pairs':>5}  {'accuracy':>8}  {'margin':>8}")
        for c, r in report["categories"].items():
            lines.append(f"{c:<{width}}  {r['n']:>5}  {r['accuracy']:>8.{digits}f}  {r['margin']:>8.{digits}f}")
    return "\n".join(lines)


def read_kind(model_dir: str | Path):
    """The `RewardKind` a reward model was saved with: `reward_model.json`, else Bradley-Terry (a model
    `trajtune rm` saved before it recorded its kind). A directory with no value head is not a reward model."""
    from ...models.hf import check_model_dir
    from ...sources.scoring import RewardKind

    path = check_model_dir(model_dir)
    if not (path / "value_head.safetensors").exists():
        raise ConfigError(f"{path}: not a reward model saved by `trajtune rm` (no value_head.safetensors next to its "
                          "weights); train one with `trajtune rm`")
    kind_file = path / KIND_FILE
    if not kind_file.exists():
        return RewardKind()
    try:
        return RewardKind(**json.loads(kind_file.read_text()))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{kind_file}: not a reward-model description ({e})") from None


def evaluate_dir(model_dir: str, data: str, batch_size: int = 16, max_length: int = 1024, device: str = "cpu") -> dict:
    """`trajtune rm-eval`: check the model and the rows (a `ConfigError` naming the directory, file, line or field),
    score every pair as the model's kind says, return `evaluate_pairs`' report."""
    from .recipe import check_device, user_errors

    if batch_size < 1 or max_length < 1:
        raise ConfigError("rm-eval: --batch-size and --max-length must be >= 1")
    with user_errors():
        kind = read_kind(model_dir)
        pairs, tokenizer = _pairs(model_dir, data, max_length)
        check_device(device)
        return _score(model_dir, kind, pairs, tokenizer, batch_size, device)


def _pairs(model_dir: str, data: str, max_length: int):
    from ...models.hf import load_tokenizer
    from ...sources import data as D
    from ...text.chat import ChatRenderer
    from .prepare import fit

    tokenizer = load_tokenizer(model_dir)
    pairs = D.preference_pairs(D.read_rows(data), ChatRenderer(tokenizer))

    def too_long(pair):
        n = max(len(pair[0]), len(pair[1]))
        return f"{pair[0].info['source']}: {n} tokens" if n > max_length else None

    return fit(pairs, f"--max-length {max_length}", False, too_long, "pairs"), tokenizer


def _score(model_dir: str, kind, pairs, tokenizer, batch_size: int, device: str) -> dict:
    import torch

    from ...engine import make_engine
    from ...models import hf
    from ...sources.scoring import reward_model_scores, token_reward_scores

    policy = hf.load_policy(model_dir, value_head=True)
    engine = make_engine(policy, None, device=device, frozen=True)
    pad_id = tokenizer.pad_token_id

    def score(trajs):
        with torch.no_grad():
            if kind.per_token:
                return token_reward_scores(engine, trajs, pad_id, kind.objective, kind.aggregate, batch_size)
            return reward_model_scores(engine, trajs, pad_id, batch_size)

    return evaluate_pairs(score, pairs)
