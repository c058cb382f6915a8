"""Evaluation prompts (book ch.16): the book's MMLU-style, few-shot and Tülu 3 CoT forms, character for character."""

import pytest

from trajtune.sources.rewards.answers import exact_letter
from trajtune.text.eval_prompts import cot_exemplar, few_shot, multiple_choice, tulu3_mc_cot

Q1 = ("A right triangle has legs of lengths 3 and 4. What is the length of its hypotenuse?", ["5", "6", "7", "8"], 0)
Q2 = ("Which of the following is the chemical symbol for Sodium?", ["Na", "S", "N", "Ca"], 0)
NEW = ("Which theorem states that if a function f is continuous on a closed interval [a,b], then f must attain both "
       "a maximum and a minimum on that interval?",
       ["The Mean Value Theorem", "The Intermediate Value Theorem", "The Extreme Value Theorem", "Rolle's Theorem"])


def test_few_shot_is_the_books_example():
    text = few_shot([Q1, Q2], *NEW, k=2, seed=0)
    for line in ["Below are examples of MMLU-style questions and answers:", "### Example 1", "### Example 2",
                 "Choices:\n(A) Na\n(B) S\n(C) N\n(D) Ca\n\nCorrect Answer: (A)",
                 "### Now answer the new question in the same style:\n\nQ: Which theorem",
                 "(D) Rolle's Theorem\n\nCorrect Answer:"]:
        assert line in text
    assert text.endswith("Correct Answer:")
    picked = {few_shot([Q1, Q2], *NEW, k=1, seed=s).count("Sodium") for s in range(10)}
    assert picked == {0, 1}  # the seed picks the exemplar
    assert few_shot([Q1, Q2], *NEW, k=1, seed=4) == few_shot([Q1, Q2], *NEW, k=1, seed=4)
    zero = few_shot([Q1, Q2], *NEW, k=0)
    assert zero == multiple_choice(*NEW) and "Example" not in zero
    with pytest.raises(ValueError, match="k must be in 0..2"):
        few_shot([Q1, Q2], *NEW, k=3)


def test_tulu3_prompt_and_its_scorer():
    p = tulu3_mc_cot("What is 2+2?", ["3", "4"])
    assert p.startswith("Answer the following multiple-choice question by giving the correct answer letter in parentheses.")
    assert "Question: What is 2+2?\n(A) 3\n(B) 4\n\nAnswer the above question and REMEMBER" in p
    assert exact_letter(completions=["2+2 is 4. Therefore, the answer is (B)"], answer=["B"]) == [1.0]


def test_cot_exemplar_and_errors():
    assert cot_exemplar("Q?", "5 + 6 = 11.", "11") == "Q: Q?\n\nA: 5 + 6 = 11. The answer is 11."
    assert cot_exemplar("Q?", "", "11") == "Q: Q?\n\nA: The answer is 11."
    with pytest.raises(ValueError, match="1 to 26 choices"):
        multiple_choice("q", [])
    with pytest.raises(ValueError, match="answer index 4"):
        multiple_choice("q", ["a", "b"], answer=4)
