"""Rubrics as rewards (trajtune.sources.rewards.rubric): the score, the book's two JSON formats, the scorer."""

import json

import pytest

from trajtune.sources.rewards import RewardBatch
from trajtune.sources.rewards.rubric import (Rubric, RubricError, RubricItem, RubricReward, load_rubric,
                                             rubric_score, slug)


def test_rubric_score_hand_worked():
    w = [5, 3, -2]
    # met 5 and the pitfall: (5 - 2) / (5 + 3) = 0.375
    assert rubric_score([True, False, True], w) == pytest.approx(0.375)
    assert rubric_score([True, False, True], w, "sum") == 3.0
    # only the pitfall: -2 / 8 = -0.25; clipped at 0
    assert rubric_score([False, False, True], w) == pytest.approx(-0.25)
    assert rubric_score([False, False, True], w, "clipped") == 0.0
    # the second item does not apply: out of both sums, 5 / 5 = 1
    assert rubric_score([True, None, False], w) == 1.0
    # a missed [Hard Rule] item gates the score to 0
    assert rubric_score([False, True, False], w, hard=[True, False, False], hard_rules=True) == 0.0
    assert rubric_score([False, True, False], w, hard=[True, False, False]) == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="how must be one of"):
        rubric_score([True], [1], "mean")


FORMAT_A = [
    {"title": "Energy conserved",
     "description": "Essential Criteria: States that total mechanical energy is conserved.", "weight": 5},
    {"title": "Numbers shown", "description": "Important Criteria: Breaks down the numerical energy values.",
     "weight": 3},
    {"title": "Friction ignored", "description": "Pitfall Criteria: Does not mention that friction is neglected.",
     "weight": -1},
]
FORMAT_B = {"initial_reasoning": "The user wants five artifacts.",
            "rubrics": [{"reasoning": "asked for five", "criterion": "The response includes exactly five distinct "
                         "artifacts as requested. [Hard Rule]", "weight": 9},
                        {"reasoning": "clarity", "criterion": "The response is well organized.", "weight": 2}]}


def test_load_the_books_formats(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(FORMAT_A))
    r = load_rubric(a)
    assert [(i.title, i.category, i.weight) for i in r.items] == [
        ("Energy conserved", "Essential", 5.0), ("Numbers shown", "Important", 3.0),
        ("Friction ignored", "Pitfall", -1.0)]
    assert r.items[0].criterion == "States that total mechanical energy is conserved."
    b = tmp_path / "b.json"
    b.write_text(json.dumps(FORMAT_B))
    r = load_rubric(b)
    assert r.reasoning == "The user wants five artifacts."
    assert ([i.hard for i in r.items] == [True, False]
            and r.items[0].title == "The response includes exactly five distinct")


@pytest.mark.parametrize("data, message", [
    ([{"title": "x", "description": "Essential Criteria: y", "weight": 7}],
     r"a\.json item 1 \('x'\).*Essential.*1 to 5, got 7"),
    ([{"title": "x", "description": "Pitfall Criteria: y", "weight": 1}], r"item 1 .*Pitfall.*-2 to -1"),
    ([{"title": "x", "description": "Nice: y", "weight": 1}],
     r"item 1 \('x'\): 'description' must begin with its category"),
    ([{"title": "x", "description": "Essential Criteria: y", "weight": 2},
      {"title": "z", "weight": 2}], r"a\.json item 2: missing \['description'\]"),
    ([{"title": "x", "description": "Essential Criteria: y", "weight": 2.5}], r"item 1 .*'weight' must be an integer"),
    ([{"title": "x", "description": "Essential Criteria: y", "weight": 2, "score": 1}], r"unknown keys \['score'\]"),
    ({"rubrics": [{"criterion": "c", "weight": 11}]}, r"item 1 \('c'\): 'weight' must be 1 to 10"),
    ({"rules": []}, r"expected Format A .* or Format B"),
    ([{"title": "x", "description": "Pitfall Criteria: y", "weight": -1}], "no item has a positive weight"),
    ([{"title": "x", "description": "Essential Criteria: y", "weight": 2, "check": "nocolon"}], "verifier spec"),
])
def test_bad_rubrics_name_file_item_and_field(tmp_path, data, message):
    p = tmp_path / "a.json"
    p.write_text(json.dumps(data))
    with pytest.raises(RubricError, match=message):
        load_rubric(p)


def test_not_json_names_line(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('[\n{"title": }\n]')
    with pytest.raises(RubricError, match=r"r\.json: not JSON \(line 2"):
        load_rubric(p)


def batch_of(completions):
    n = len(completions)
    return RewardBatch(["Q: love\nA: "] * n, list(completions), [[]] * n, {"word": ["love"] * n},
                       [f"p:{i + 1}" for i in range(n)])


def starts_with_word(completions, word, **kw):
    return [float(c.startswith(w.capitalize())) for c, w in zip(completions, word)]


class YesJudge:
    """Answers the rubric's question 'ends with a period' right, except 'unsure' for replies ending with '?'."""

    def __init__(self):
        self.asked = []

    def ask(self, questions, answers, criteria):
        self.asked += list(zip(questions, answers, criteria))
        return [None if a.endswith("?") else a.endswith(".") for a in answers]


def test_rubric_reward_with_verifiers_and_a_judge(tmp_path):
    checks = tmp_path / "checks.py"
    checks.write_text("def shouting(completions, **kw):\n"
                      "    return [1.0 if c.isupper() else 0.0 for c in completions]\n")
    rubric = Rubric([RubricItem("Starts with the word", "starts with the word", 4, check=starts_with_word),
                     RubricItem("Ends with a period", "The reply ends with a period.", 2),
                     RubricItem("Shouting", "all capitals", -2, "Pitfall", check=f"{checks}:shouting")], "r.json")
    judge = YesJudge()
    reward = RubricReward(rubric, judge)
    out = reward(batch_of(["Love is kind.", "Love me", "LOVE.", "Hate.", "Love?"]))
    # weights 4, 2, -2 (positive 6): met (4, 2) -> 1; (4) -> 4/6; "LOVE." does not start with "Love": (2, -2) -> 0;
    # (2) -> 2/6; the judge unsure -> None (unscored, not 0)
    assert out == [1.0, pytest.approx(4 / 6), 0.0, pytest.approx(2 / 6), None]
    assert judge.asked[0] == ("Q: love\nA: ", "Love is kind.", "The reply ends with a period.")
    m = reward.metrics
    assert m["reward/rubric/pass/starts_with_the_word"] == 3 / 5
    assert m["reward/rubric/pass/ends_with_a_period"] == 3 / 4  # the unparseable one is not graded
    assert m["reward/rubric/pass/shouting"] == 1 / 5
    assert m["reward/rubric/ungraded"] == 1 / 5


def test_rubric_reward_errors():
    rubric = Rubric([RubricItem("Ends", "ends with a period", 1)], "r.json")
    with pytest.raises(RubricError, match=r"r\.json: items \['Ends'\] have no 'check'.*judge"):
        RubricReward(rubric)
    bad = Rubric([RubricItem("Len", "short", 1, check=lambda completions, **kw: ["long"] * len(completions))], "r.json")
    with pytest.raises(RubricError, match=r"item 'Len' .*returned 'long' \(str\) for p:1"):
        RubricReward(bad)(batch_of(["a"]))
    boom = Rubric([RubricItem("Boom", "x", 1, check=lambda completions, **kw: 1 / 0)], "r.json")
    with pytest.raises(RubricError, match=r"(?s)item .Boom.*raised:.*ZeroDivisionError"):
        RubricReward(boom)(batch_of(["a"]))
    assert slug("Ends with a period!") == "ends_with_a_period"
