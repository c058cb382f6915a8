"""Sort by length before batched reward-model inference (book ch.9, checklist 9.4b): the same scores, in the
input order, from batches that pad less."""

import torch

from trajtune.sources.scoring import reward_model_scores

from test_algorithms import TOK, demo, engine


class Spy:
    """An engine that records each batch's real lengths and padded width."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def forward(self, batch, **kw):
        self.batches.append((batch.attention_mask.sum(-1).tolist(), batch.ids.shape[1]))
        return self.inner.forward(batch, **kw)


def test_sorted_scoring_gives_the_same_scores_in_input_order_with_less_padding():
    trajs = [demo("a" * n) for n in (9, 1, 12, 2, 7, 3, 11, 1)]
    e = engine(seed=5, value_head=True)
    plain, ordered = Spy(e), Spy(e)
    want = reward_model_scores(plain, trajs, TOK.pad_id, batch_size=3)
    got = reward_model_scores(ordered, trajs, TOK.pad_id, batch_size=3, sort_by_length=True)
    assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-5)
    assert len(set(want)) > 4  # the scores differ per episode, so a mixed-up order would show
    lengths = [n for real, _ in ordered.batches for n in real]
    assert lengths == sorted(len(t) for t in trajs)  # batches are length-sorted, shortest first
    padded = lambda spy: sum(len(real) * width for real, width in spy.batches)  # noqa: E731
    assert padded(ordered) < padded(plain)
    assert reward_model_scores(e, [], TOK.pad_id, sort_by_length=True) == []
