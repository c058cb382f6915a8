"""Bias audits and over-optimization signatures (book ch.11.7, ch.14.5) on hand-worked texts and numbers."""

import math

import pytest

from trajtune.audits import (length_bias, list_share, longer_preferred, max_token_share, prefix_agreement,
                             repetition, signature_shares)


def test_signatures_on_the_books_phrases():
    texts = ["As an AI language model, I cannot have opinions.", "Certainly! Here is the answer.",
             "I'm sorry, I apologize for the confusion.", "The capital of France is Paris.",
             "I can't help with that request."]
    s = signature_shares(texts)
    assert s["ai_disclaimer"] == 1 / 5 and s["certainly_opening"] == 1 / 5 and s["apology"] == 1 / 5
    assert s["refusal"] == 1 / 5 and s["hedging"] == 0.0
    assert signature_shares([]) == {k: 0.0 for k in s}
    # "sure" inside a word or later in the text is not an opening
    assert signature_shares(["I am unsure.", "It is sure."])["certainly_opening"] == 0.0


def test_repetition_counts_repeated_ngrams():
    assert repetition("the cat sat on the mat") == 0.0
    # 'a b a b a b': bigrams ab ba ab ba ab -> 5 grams, 2 distinct -> 1 - 2/5
    assert repetition("a b a b a b", n=2) == pytest.approx(0.6)
    assert repetition("one", n=3) == 0.0
    with pytest.raises(ValueError):
        repetition("x", n=0)


def test_max_token_share():
    assert max_token_share([5, 5, 5, 7]) == 0.75
    assert max_token_share([]) == 0.0


def test_length_bias_hand_values():
    # perfectly monotone: both 1; Pearson of scores [1,2,3] vs lengths [10,20,40]:
    # mx=2, my=70/3; sxy = (-1)(-40/3)+0+(1)(50/3) = 30; sxx=2; syy=(1600+100+2500)/9=4200/9
    got = length_bias([1, 2, 3], [10, 20, 40])
    assert got["spearman"] == pytest.approx(1.0)
    assert got["pearson"] == pytest.approx(30 / math.sqrt(2 * 4200 / 9))
    assert math.isnan(length_bias([1, 1], [3, 4])["pearson"])
    # ranks [1,2,3] vs [1,3,2]: deviations [-1,0,1] and [-1,1,0] -> 1 / sqrt(2 * 2)
    assert length_bias([1, 2, 3], [1, 3, 2])["spearman"] == pytest.approx(0.5)
    assert length_bias([3, 1, 2], [1, 3, 2])["spearman"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="3 scores for 2 lengths"):
        length_bias([1, 2, 3], [1, 2])


def test_longer_preferred_and_lists_and_prefix():
    assert longer_preferred([10, 5, 8, 4], [3, 9, 2, 4]) == pytest.approx(2 / 3)  # the equal pair is left out
    assert math.isnan(longer_preferred([1], [1]))
    assert list_share(["- a\n- b", "1. x\n2) y\n", "- only one", "prose"]) == 0.5
    assert prefix_agreement([1, -1, 1, 0], [1, 1, 1, 0]) == 0.75
    with pytest.raises(ValueError, match="no pairs"):
        prefix_agreement([], [])
