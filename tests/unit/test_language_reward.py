"""Language-consistency reward (checklist 7.3d): the share of the reasoning's words in the target script."""

import pytest

from trajtune.sources.rewards.language import (language_consistency, language_share, make_language_consistency,
                                               reasoning_of, script_words)


def test_script_words_and_shares_by_hand():
    assert script_words("think 思考 twice") == ["latin", "cjk", "cjk", "latin"]
    assert script_words("x = 42, y=x+1!") == ["latin"] * 3  # x, y, x: digits and symbols are no words
    assert script_words("Привет, world") == ["cyrillic", "latin"]
    # 3 Latin words of 5: "so", "the", "is" against the two ideographs of 答案
    assert language_share("so the 答案 is 4") == pytest.approx(3 / 5)
    assert language_share("so the 答案 is 4", "cjk") == pytest.approx(2 / 5)
    assert language_share("これは test", ("hiragana", "katakana", "cjk")) == pytest.approx(3 / 4)
    assert language_share("12 + 30 = 42") == 0.0  # no words: nothing in the target language


def test_the_reward_reads_the_reasoning_and_a_row_script_column():
    assert reasoning_of("<think>a 中</think><answer>42</answer>") == "a 中"
    assert reasoning_of("<think>unclosed 中") == "unclosed 中"
    assert reasoning_of("plain text") == "plain text"
    completions = ["<think>first add the numbers</think><answer>7</answer>",
                   "<think>先 add 数</think><answer>7</answer>",
                   [{"role": "assistant", "content": "<think>всё ok</think>7"}]]
    assert language_consistency(completions) == pytest.approx([1.0, 1 / 3, 0.5])
    assert make_language_consistency("cjk")(completions) == pytest.approx([0.0, 2 / 3, 0.0])
    per_row = language_consistency(completions, script=["latin", "cjk", "cyrillic"])
    assert per_row == pytest.approx([1.0, 2 / 3, 0.5])


def test_it_loads_as_a_reward_spec():
    from trajtune.sources.rewards.functions import load_reward_function

    fn = load_reward_function("trajtune.sources.rewards.language:language_consistency")
    assert fn(["<think>mostly English, 少し</think>"]) == pytest.approx([2 / 4])
