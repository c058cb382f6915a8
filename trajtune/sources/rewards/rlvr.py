"""RLVR's reward knobs (RLHF book ch.7.3, "common practice"), as TRL reward functions.

Each has TRL's signature (trajtune.sources.rewards) and combines with a verifier by --reward-weights:

    trajtune grpo --model M --data math.jsonl --reward trajtune.sources.rewards.answers:exact_answer \\
        --reward trajtune.sources.rewards.rlvr:format_reward --reward-weights 1.0 0.5

    format_reward     0.25 for each of <think>, </think>, <answer>, </answer> in its place (DeepSeek-R1's format reward
                      as open recipes grade it: "Format rewards for <think>...</think> before the answer")
    tests_passed      partial credit for code: the share of a row's test cases ('tests' column: [[args], expected]
                      pairs, 'entry_point': the function's name) the completion's code passes in the sandbox
                      (ch.7.1: "give partial credit = fraction of tests passed"); all_tests_passed gates to 1/0
    partial_credit    the same share from a checker of your own: fn(text, **row) -> one bool per check
    length_penalty    0 up to a budget, then -per_token for every token beyond it (ch.7.3 length penalties;
                      INTELLECT-2's small constant penalty), floored at -cap where one is given

The language-consistency reward (ch.7.3) is `trajtune.sources.rewards.language:language_consistency`.

`make_format_reward`, `make_length_penalty` and `partial_credit` build variants (other tags, budgets, checkers); a
module-level variant in your own file is what `--reward file.py:name` loads.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

PER_TAG = 0.25
"""format reward per tag in its place (four tags: at most 1.0)"""
LENGTH_PER_TOKEN = 1e-3
"""length_penalty's slope: reward lost per token beyond the budget"""
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def _texts(completions: Sequence[Any]) -> list[str]:
    """The text of each completion: a string, or the last message's content (conversational rows)."""
    return [c if isinstance(c, str) else c[-1]["content"] for c in completions]


def tag_score(text: str, tags: Sequence[str] = ("think", "answer"), per_tag: float = PER_TAG) -> float:
    """`per_tag` for every opening and every closing tag of `tags` that is in its place: it occurs exactly once,
    each closing tag after its opening tag, and each tag pair after the previous pair's closing tag.

        "<think>a</think><answer>4</answer>"   -> 1.0
        "<think>a</think> 4"                   -> 0.5   (no answer tags)
        "<think>a<think></think>"              -> 0.25  (two <think>: the opening tag is not in place)
        "</think>a<think>"                     -> 0.25  (the closing tag comes before the opening one)
    """
    score, after = 0.0, 0  # after: where the previous tag in place ended
    for name in tags:
        opening, closing = f"<{name}>", f"</{name}>"
        o = text.find(opening) if text.count(opening) == 1 else -1
        c = text.find(closing) if text.count(closing) == 1 else -1
        if o >= after:
            score += per_tag
            after = o + len(opening)
        if c >= 0 and c >= after and (o < 0 or c > o):
            score += per_tag
            after = c + len(closing)
    return score


def make_format_reward(tags: Sequence[str] = ("think", "answer"), per_tag: float = PER_TAG) -> Callable:
    """A TRL reward function: `tag_score` of each completion with these tags."""

    def format_reward(completions, **kwargs) -> list[float]:
        return [tag_score(t, tags, per_tag) for t in _texts(completions)]

    return format_reward


format_reward = make_format_reward()
format_reward.__doc__ = ("TRL reward: 0.25 for each of <think>, </think>, <answer>, </answer> in its place "
                         "(`tag_score`): 1.0 for '<think>...</think><answer>...</answer>'.")


def code_of(text: str) -> str:
    """The code in a completion: its last ```python fenced block, else the whole text."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def _cases(tests: Any, row: int) -> list[tuple[list, Any]]:
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"row {row}: column 'tests' must be a non-empty list of [args, expected] pairs, got {tests!r}")
    out = []
    for i, case in enumerate(tests):
        if not (isinstance(case, (list, tuple)) and len(case) == 2 and isinstance(case[0], (list, tuple))):
            raise ValueError(f"row {row}: column 'tests'[{i}] must be [args, expected] (args a list), got {case!r}")
        out.append((list(case[0]), case[1]))
    return out


def case_outcomes(completions, tests, entry_point, sandbox=None) -> list[list[bool]]:
    """Per completion, whether each of its row's test cases passed: the completion's code (`code_of`) defines
    `entry_point`, called on each case's args in the sandbox (`trajtune.envs.sandbox`: time and memory limits,
    a timeout or an exception is a failed case)."""
    from ...envs.sandbox import default_sandbox

    box = sandbox or default_sandbox()
    out = []
    for i, (text, cases, entry) in enumerate(zip(_texts(completions), tests, entry_point, strict=True)):
        results = box.run(code_of(text), str(entry), _cases(cases, i))
        out.append([r == "pass" for r in results])
    return out


def tests_passed(completions, tests, entry_point, **kwargs) -> list[float]:
    """TRL reward, partial credit: the share of the row's `tests` ([[args], expected] pairs) that the
    completion's `entry_point` function passes (3 of 4 -> 0.75)."""
    return [sum(ok) / len(ok) for ok in case_outcomes(completions, tests, entry_point)]


def all_tests_passed(completions, tests, entry_point, **kwargs) -> list[float]:
    """TRL reward, gated: 1.0 only when every one of the row's `tests` passes, else 0.0."""
    return [float(all(ok)) for ok in case_outcomes(completions, tests, entry_point)]


def partial_credit(check: Callable[..., Sequence[bool]]) -> Callable:
    """A TRL reward function from a checker: `check(text, **row)` -> one bool per check (an instruction-following
    constraint, a unit test you run yourself); the reward is the share that hold. `row` is the row's columns."""

    def reward(completions, **columns) -> list[float]:
        out = []
        for i, text in enumerate(_texts(completions)):
            row = {k: v[i] for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == len(completions)}
            results = list(check(text, **row))
            if not results:
                raise ValueError(f"partial_credit: the checker {getattr(check, '__name__', check)!r} returned no "
                                 f"results for completion {i}")
            out.append(sum(map(bool, results)) / len(results))
        return out

    reward.__name__ = f"partial_{getattr(check, '__name__', 'check')}"
    return reward


def length_score(n_tokens: int, budget: int, per_token: float = LENGTH_PER_TOKEN, cap: float | None = None) -> float:
    """0 up to `budget` tokens, then -per_token for each token beyond it, at least -cap (cap None: no floor).

        budget 100, per_token 0.01: 80 tokens -> 0.0, 100 -> 0.0, 150 -> -0.5, 400 -> -3.0 (cap 1.0: -1.0)
    """
    over = max(0, n_tokens - budget)
    penalty = per_token * over
    return -(penalty if cap is None else min(cap, penalty))


def make_length_penalty(budget: int, per_token: float = LENGTH_PER_TOKEN, cap: float | None = None) -> Callable:
    """A TRL reward function: `length_score` of each completion's token count (completion_ids, the stop token
    included) against a fixed budget."""
    if budget < 0 or not per_token >= 0 or (cap is not None and not cap >= 0):
        raise ValueError(f"make_length_penalty: budget and per_token must be >= 0 and cap None or >= 0, got "
                         f"budget={budget}, per_token={per_token}, cap={cap}")

    def length_penalty(completion_ids, **kwargs) -> list[float]:
        return [length_score(len(ids), budget, per_token, cap) for ids in completion_ids]

    return length_penalty


def length_penalty(completion_ids, length_budget, **kwargs) -> list[float]:
    """TRL reward: 0 up to the row's `length_budget` column (tokens), then -0.001 per token beyond it
    (`length_score`); a per-row budget lets the data raise it as training goes (Kimi 1.5's schedule)."""
    out = []
    for i, (ids, budget) in enumerate(zip(completion_ids, length_budget, strict=True)):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"row {i}: column 'length_budget' must be a whole number of tokens >= 0, got {budget!r}")
        out.append(length_score(len(ids), budget))
    return out
