"""Evaluation prompts in the book's regimes (RLHF book ch.16 "Evaluation", checklist 16.1): few-shot, chain of
thought, and Tülu 3's multiple-choice CoT prompt.

    multiple_choice(question, choices)          'Q: ...\\nChoices:\\n(A) ...' as the book's MMLU-style examples
    few_shot(exemplars, question, choices, k, seed)
                                                k solved exemplars (drawn with a seeded generator, 3-8 typical:
                                                "the number of examples used in-context is ... a design
                                                parameter and ranges from 3 to 8 or more"), then the question
                                                ending in 'Correct Answer:'
    tulu3_mc_cot(question, choices)             the Tülu 3 MMLU CoT prompt, verbatim: concise reasoning finishing
                                                with "Therefore, the answer is (X)" (score it with
                                                `trajtune.sources.rewards.answers.exact_letter`)
    cot_exemplar(question, reasoning, answer)   'Q: ...\\n\\nA: <reasoning> The answer is N.' (Wei et al.'s form)

Letters run A, B, C, ... (at most 26 choices). The texts are plain strings: put them in a user message, or use
them raw with a base model (ch.16: "log-likelihood scoring is more common in pretraining evaluation").
"""

from __future__ import annotations

import random
import string
from typing import Sequence

TULU3_MC_COT = (
    "Answer the following multiple-choice question by giving the correct answer letter in parentheses.\n"
    "Provide CONCISE reasoning for the answer, and make sure to finish the response with \"Therefore, the answer "
    "is (ANSWER_LETTER)\" where (ANSWER_LETTER) is one of (A), (B), (C), (D), (E), etc.\n\n"
    "Question: {question}\n{choices}\n\n"
    "Answer the above question and REMEMBER to finish your response with the exact phrase \"Therefore, the answer "
    "is (ANSWER_LETTER)\" where (ANSWER_LETTER) is one of (A), (B), (C), (D), (E), etc."
)
"""the book's ch.16 prompt (Tülu 3), with {question} and {choices} ('(A) ...' lines)"""


def letters(n: int) -> list[str]:
    """The first n choice letters, 'A', 'B', ...; at most 26."""
    if not 1 <= n <= 26:
        raise ValueError(f"a multiple-choice question needs 1 to 26 choices, got {n}")
    return list(string.ascii_uppercase[:n])


def choice_lines(choices: Sequence[str]) -> str:
    """'(A) first\\n(B) second ...'"""
    return "\n".join(f"({x}) {c}" for x, c in zip(letters(len(choices)), choices))


def multiple_choice(question: str, choices: Sequence[str], answer: int | None = None) -> str:
    """One question in the book's MMLU-style form; with `answer` (an index) it is a solved exemplar ending in
    'Correct Answer: (X)', else it ends in 'Correct Answer:' for the model to complete."""
    if answer is not None and not 0 <= answer < len(choices):
        raise ValueError(f"multiple_choice: answer index {answer} is not one of the {len(choices)} choices")
    tail = "Correct Answer:" + (f" ({letters(len(choices))[answer]})" if answer is not None else "")
    return f"Q: {question}\nChoices:\n{choice_lines(choices)}\n\n{tail}"


def few_shot(exemplars: Sequence[tuple[str, Sequence[str], int]], question: str, choices: Sequence[str], k: int,
             seed: int = 0) -> str:
    """The book's few-shot prompt: k (question, choices, answer index) exemplars drawn without replacement with
    `random.Random(seed)`, numbered, then the new question. k = 0 is the zero-shot form of the same question."""
    if not 0 <= k <= len(exemplars):
        raise ValueError(f"few_shot: k must be in 0..{len(exemplars)} (the exemplars given), got {k}")
    shots = random.Random(seed).sample(list(exemplars), k)
    parts = ["Below are examples of MMLU-style questions and answers:"] if k else []
    parts += [f"### Example {i + 1}\n" + multiple_choice(q, c, a) for i, (q, c, a) in enumerate(shots)]
    parts.append(("### Now answer the new question in the same style:\n\n" if k else "")
                 + multiple_choice(question, choices))
    return "\n\n".join(parts)


def tulu3_mc_cot(question: str, choices: Sequence[str]) -> str:
    """The Tülu 3 MMLU chain-of-thought prompt of ch.16, verbatim, for one question."""
    return TULU3_MC_COT.format(question=question, choices=choice_lines(choices))


def cot_exemplar(question: str, reasoning: str, answer: str) -> str:
    """A chain-of-thought exemplar as in ch.16 (Wei et al.): 'Q: ...\\n\\nA: <reasoning> The answer is N.'
    (empty reasoning: the standard-prompting exemplar 'A: The answer is N.')."""
    body = f"{reasoning.strip()} " if reasoning.strip() else ""
    return f"Q: {question}\n\nA: {body}The answer is {answer}."
