"""AI feedback procedures (trajtune.algorithms.ai_feedback) on hand-worked values."""

import math

import pytest
import torch

from trajtune.algorithms.ai_feedback import (CRITIQUE_REQUEST, REVISION_REQUEST, choice_logprobs,
                                             constitutional_revisions, feedback_messages, label_pairs, likert_label,
                                             rlaif_pairs, soft_labels, ultrafeedback_pairs)


def test_label_pairs_drops_and_counts_ties_and_unparseable():
    out = label_pairs(["A", "tie", "B", None], ["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4"])
    assert out.pairs == [(0, "a1", "b1"), (2, "b3", "a3")]  # B won item 2: b3 is chosen
    assert (out.ties, out.unparseable, out.n) == (1, 1, 4)
    with pytest.raises(ValueError, match="item 0: verdict 'C'"):
        label_pairs(["C"], ["a"], ["b"])


def test_rlaif_pairs_uses_the_judges_swap_consistent_labels():
    class Judge:
        def compare(self, questions, a, b):
            return ["A" if x.endswith(".") else "tie" for x in a]

    out = rlaif_pairs(Judge(), ["q", "q"], ["x.", "y"], ["z", "w."])
    assert out.pairs == [(0, "x.", "z")] and out.ties == 1


def test_constitutional_revisions_samples_a_principle_per_round_and_keeps_the_last():
    constitution = ["Be brief.", "Be kind.", "Be true."]
    seen = []

    def generate(conversations):
        seen.append(conversations)
        last = conversations[-1][-1]["content"]
        if last == REVISION_REQUEST:  # revision: the old response plus the principle's first word
            return [c[1]["content"] + "+" + c[2]["content"].split(": ")[1].split()[1].rstrip(".")
                    for c in conversations]
        return ["too long"] * len(conversations)

    out = constitutional_revisions(generate, ["x1", "x2"], ["y1", "y2"], constitution, rounds=2,
                                   generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    picks = [torch.randint(3, (2,), generator=g).tolist() for _ in range(2)]  # [round][prompt]
    words = ["brief", "kind", "true"]
    assert [r.response for r in out] == [f"y{i + 1}+{words[picks[0][i]]}+{words[picks[1][i]]}" for i in range(2)]
    assert [h["principle"] for h in out[0].history] == [constitution[picks[0][0]], constitution[picks[1][0]]]
    assert out[0].first == "y1" and out[0].history[0]["critique"] == "too long"
    assert len(seen) == 4  # two batched calls per round
    assert seen[0][0][-1]["content"] == CRITIQUE_REQUEST.format(principle=constitution[picks[0][0]])
    with pytest.raises(ValueError, match="no principles"):
        constitutional_revisions(generate, ["x"], ["y"], [], 1, torch.Generator())


def test_soft_labels_hand_worked():
    logp = torch.log(torch.tensor([[0.3, 0.1], [0.2, 0.2], [0.05, 0.6]]))
    # P(A) = 0.3 / (0.3 + 0.1) = 0.75; 0.5; 0.05 / 0.65
    assert soft_labels(logp).tolist() == pytest.approx([0.75, 0.5, 0.05 / 0.65])
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        soft_labels(torch.zeros(3))


def test_choice_logprobs_reads_the_next_token_after_each_prompt():
    from trajtune.engine import make_engine
    from trajtune.models.tiny import TinyConfig, TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(12, dim=16, n_layers=1, n_heads=2, max_len=16))
    engine = make_engine(model, frozen=True)
    prompts = [[1, 4, 5, 6], [1, 7]]  # different lengths: the second is padded
    got = choice_logprobs(engine, prompts, [8, 9], pad_id=0)
    assert got.shape == (2, 2)
    for row, p in enumerate(prompts):
        want = torch.log_softmax(model(torch.tensor([p]))[0, -1], -1)[[8, 9]]
        assert torch.allclose(got[row], want, atol=1e-5)


def test_feedback_messages_label_a_and_b():
    text = feedback_messages("hi?", "Hello.", "Go away.", ["Be kind.", "Be brief."])[0]["content"]
    assert "(A) Hello.\n(B) Go away." in text and "- Be kind.\n- Be brief." in text


@pytest.mark.parametrize("points, score, want", [
    (5, 1, ("A", 2)), (5, 2, ("A", 1)), (5, 3, (None, 0)), (5, 4, ("B", 1)), (5, 5, ("B", 2)),
    (8, 1, ("A", 4)), (8, 4, ("A", 1)), (8, 5, ("B", 1)), (8, 8, ("B", 4)),  # |score - 4.5| rounded up
])
def test_likert_label(points, score, want):
    assert likert_label(score, points) == want


def test_likert_rejects_off_scale():
    with pytest.raises(ValueError, match="integer 1..5"):
        likert_label(6, 5)
    with pytest.raises(ValueError, match="5 or 8"):
        likert_label(1, 7)


def test_ultrafeedback_pairs():
    g = torch.Generator().manual_seed(0)
    ratings = [[2, 5, 3],  # best 1 (5); lower: 0 (2), 2 (3) -> one drawn
               [4, 4],  # all equal: no pair
               [1, 5, 5, 2]]  # best is the first 5 (index 1); lower: 0, 3 (index 2 ties the best: not lower)
    out = ultrafeedback_pairs(ratings, g)
    g = torch.Generator().manual_seed(0)
    j0 = [0, 2][int(torch.randint(2, (1,), generator=g))]
    j2 = [0, 3][int(torch.randint(2, (1,), generator=g))]
    assert out == [(0, 1, j0, 5.0 - ratings[0][j0]), (2, 1, j2, 5.0 - ratings[2][j2])]
    # Llama 2's example: chosen rated 5, rejected 2 -> margin 3
    assert ultrafeedback_pairs([[5, 2]], torch.Generator())[0][3] == 3.0
    assert math.isclose(ultrafeedback_pairs([[1.5, 4.0]], torch.Generator())[0][3], 2.5)


def test_constraint_pairs_keep_the_constraint_in_the_prompt():
    from trajtune.algorithms.ai_feedback import constraint_pairs

    def generate(convs):  # follows a constraint when it sees one; the last prompt's model ignores it
        out = []
        for c in convs:
            text = c[-1]["content"]
            out.append("HELLO" if "upper case" in text and "ignore" not in text else "hello")
        return out

    pairs = constraint_pairs(generate, ["Say hi.", "Say hi, ignore rules."], ["Answer in upper case."] * 2)
    assert pairs[0] == ("Say hi.\n\nAnswer in upper case.", "HELLO", "hello")
    checked = constraint_pairs(generate, ["Say hi.", "Say hi, ignore rules."], ["Answer in upper case."] * 2,
                               check=lambda c, r: r.isupper())
    assert [p[0] for p in checked] == ["Say hi.\n\nAnswer in upper case."]  # the second chosen reply fails the check
    with pytest.raises(ValueError, match="2 prompts for 1 constraints"):
        constraint_pairs(generate, ["a", "b"], ["c"])
