"""Answer extraction and exact-match rewards (book ch.7 / ch.16 16.2(a)): the book's conventions by hand."""

import pytest

from trajtune.sources.rewards.answers import (after_hashes, answer_is, boxed, exact_answer, exact_letter, extract,
                                              letter, normalize, same_answer)


def test_the_books_forms():
    assert boxed("so the total is 7. The answer is $\\boxed{77}$.") == "77"  # ch.7's example
    assert boxed("\\boxed{\\frac{1}{2}} then \\boxed{3}") == "3"  # the last one
    assert boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # nested braces
    assert boxed("\\boxed{12} and \\boxed{unclosed") == "12"
    assert boxed("no box") is None
    assert after_hashes("work...\n#### 1,234\n") == "1,234"
    assert after_hashes("#### \n") is None
    assert answer_is("Roger has 5 + 6 = 11 balls. The answer is 11.") == "11"  # ch.16's CoT exemplar
    assert answer_is("The answer is: 3\nwait, the answer is 4") == "4"
    assert letter("(A) is tempting... Therefore, the answer is (C)") == "C"
    assert letter("no letter here (c)") is None


def test_extract_any_order_and_errors():
    assert extract("The answer is 5 \\boxed{6}") == "6"  # boxed first
    assert extract("#### 8\nThe answer is 9") == "8"
    assert extract("nothing") is None
    with pytest.raises(ValueError, match="how must be"):
        extract("x", "regex")


def test_normalize_and_compare():
    assert normalize(" $1,000. ") == "1000"
    assert normalize("3.0") == "3" and normalize("-0.50") == "-0.5"
    assert normalize("Paris.") == "Paris"
    assert same_answer("The answer is 3.0", 3) and not same_answer("The answer is 4", 3)
    assert not same_answer("I think 3", 3)  # no extractable answer: wrong, as a format failure


def test_trl_rewards():
    completions = ["The answer is 42.", [{"role": "assistant", "content": "#### 7"}], "forty-two"]
    assert exact_answer(completions=completions, answer=["42", "8", "42"]) == [1.0, 0.0, 0.0]
    assert exact_letter(completions=["Therefore, the answer is (B)", "(A)"], answer=["(B)", "C"]) == [1.0, 0.0]
