"""ORM / PRM aggregation extras (checklist 5.6e, 5.7d): mean of the last m, the any-p_t-below-tau flag, the
weighted sum favouring later steps, by hand."""

import math

import pytest
import torch

from trajtune.objectives.reward_model import AGGREGATES, MORE_AGGREGATES, aggregate_scores

LN3 = math.log(3.0)
# row 0: p = 0.25, (unmarked), 0.5, 0.75 at the marked positions; row 1: one marked p = 0.75; row 2: none marked
LOGITS = torch.tensor([[-LN3, 9.0, 0.0, LN3], [LN3, -9.0, -9.0, -9.0], [0.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_last_m_flag_and_weighted_by_hand():
    last2 = aggregate_scores(LOGITS, MASK, "last_m", m=2)
    assert last2[:2].tolist() == pytest.approx([0.625, 0.75]) and math.isnan(last2[2])  # (0.5 + 0.75) / 2
    assert aggregate_scores(LOGITS, MASK, "last_m", m=10)[0].item() == pytest.approx(0.5)  # m > K: the mean
    assert aggregate_scores(LOGITS, MASK, "last_m", m=1)[0].item() == pytest.approx(
        aggregate_scores(LOGITS, MASK, "last")[0].item())
    # weights 1, 2, 3 over the marked positions (the unmarked 9.0 counts for nothing): (0.25 + 1 + 2.25) / 6
    weighted = aggregate_scores(LOGITS, MASK, "weighted")
    assert weighted[:2].tolist() == pytest.approx([3.5 / 6, 0.75]) and math.isnan(weighted[2])
    assert weighted[0] > aggregate_scores(LOGITS, MASK, "mean")[0]  # the later, better steps weigh more
    # flag: any marked p below tau (the unmarked -9 logits of row 1 do not raise it)
    assert aggregate_scores(LOGITS, MASK, "flag", tau=0.3)[:2].tolist() == [1.0, 0.0]
    assert aggregate_scores(LOGITS, MASK, "flag", tau=0.2)[:2].tolist() == [0.0, 0.0]
    assert aggregate_scores(LOGITS, MASK, "flag", tau=0.8)[:2].tolist() == [1.0, 1.0]


def test_the_extras_are_separate_from_the_scorers_choices():
    assert not set(AGGREGATES) & set(MORE_AGGREGATES)
    with pytest.raises(ValueError, match="m must be"):
        aggregate_scores(LOGITS, MASK, "last_m", m=0)
    with pytest.raises(ValueError, match="how must be one of"):
        aggregate_scores(LOGITS, MASK, "median")
