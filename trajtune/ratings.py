"""Ratings from pairwise verdicts (RLHF book ch.16 "Human evaluation for generative language models yields Elo
rankings"; checklist 16.4, [EXT] a Bradley-Terry fit as Chatbot Arena does) and the length-controlled win rate:
pure functions of (a, b, score of a) verdicts, seeded where they shuffle.

    elo_ratings(verdicts, k_factor, initial, scale, seed)     sequential Elo updates, in a seeded order
    bradley_terry_ratings(verdicts, prior, scale, ...)        the maximum-likelihood Bradley-Terry fit
    length_controlled_win_rate(wins, length_diffs, iters)     a win rate with the length difference regressed out
"""

from __future__ import annotations

import random
from typing import Hashable, Sequence

import torch


# --- ratings from pairwise verdicts (RLHF book ch.16 "Human evaluation for generative language models yields
# Elo rankings"; checklist 16.4, [EXT] a Bradley-Terry fit as Chatbot Arena does) -------------------------------
Verdict = tuple[Hashable, Hashable, float]
"""(a, b, score of a): 1 a won, 0 b won, 0.5 a tie"""


def _check_verdicts(verdicts: Sequence[Verdict]) -> list[Hashable]:
    """The players in order of first appearance; a bad verdict is a ValueError naming it."""
    players: dict[Hashable, None] = {}
    for i, v in enumerate(verdicts):
        if len(v) != 3 or v[2] not in (0, 0.5, 1) or v[0] == v[1]:
            raise ValueError(f"verdict {i} {v!r}: expected (a, b, score of a) with a != b and score 1, 0.5 or 0")
        players.setdefault(v[0])
        players.setdefault(v[1])
    if not players:
        raise ValueError("no verdicts")
    return list(players)


def elo_ratings(verdicts: Sequence[Verdict], k_factor: float = 32.0, initial: float = 1000.0, scale: float = 400.0,
                seed: int | None = None) -> dict[Hashable, float]:
    """Online Elo over the verdicts: for a game of a vs b with score s (1, 0.5, 0),

        E_a = 1 / (1 + 10^((R_b - R_a) / scale)),   R_a += K (s - E_a),   R_b -= K (s - E_a)

    Elo depends on the order of the games: they are played in the given order, or (seed given) in the order
    of a `random.Random(seed)` shuffle, so a rerun gives the same ratings. returns {player: rating}.
    """
    players = _check_verdicts(verdicts)
    order = list(verdicts)
    if seed is not None:
        random.Random(seed).shuffle(order)
    rating = dict.fromkeys(players, float(initial))
    for a, b, s in order:
        expected = 1.0 / (1.0 + 10.0 ** ((rating[b] - rating[a]) / scale))
        rating[a] += k_factor * (s - expected)
        rating[b] -= k_factor * (s - expected)
    return rating


def bradley_terry_ratings(verdicts: Sequence[Verdict], prior: float = 0.0, scale: float = 400.0,
                          initial: float = 1000.0, tol: float = 1e-10, max_iter: int = 10_000) -> dict[Hashable, float]:
    """Bradley-Terry strengths by maximum likelihood, on the Elo scale: P(a beats b) = p_a / (p_a + p_b), and
    player a's rating is initial + scale * log10(p_a / geometric mean of all p), so a 400-point gap is 10:1 odds.

    Ties count as half a win for each side. Fit by the MM algorithm (Hunter 2004, "MM algorithms for
    generalized Bradley-Terry models", eq. 3): p_i <- W_i / sum_j n_ij / (p_i + p_j), W_i = wins of i, n_ij =
    games of i and j, renormalized to geometric mean 1 each sweep, until no log-strength moves by more than
    `tol`. Order-free: unlike Elo, the result does not depend on the order of the games.
    The maximum-likelihood estimate is finite only if, however the players are split in two, each side has
    won a game against the other (Hunter's condition); `prior` > 0 adds that many tied games between every
    pair of players (a symmetric prior that makes it hold). Without a prior, a player with no win or no loss
    (the common way to break it) is a ValueError naming it.
    """
    players = _check_verdicts(verdicts)
    idx = {p: i for i, p in enumerate(players)}
    n = len(players)
    wins = torch.zeros(n, n, dtype=torch.float64)  # wins[i, j]: (half) wins of i over j
    for a, b, s in verdicts:
        wins[idx[a], idx[b]] += s
        wins[idx[b], idx[a]] += 1.0 - s
    off = 1.0 - torch.eye(n, dtype=torch.float64)
    wins = wins + 0.5 * prior * off
    total = wins.sum(1)  # W_i
    games = (wins + wins.T) * off  # n_ij
    lost = wins.sum(0)
    bad = [players[i] for i in range(n) if total[i] <= 0 or lost[i] <= 0]
    if bad:
        raise ValueError(f"bradley_terry_ratings: {bad} never won or never lost a game: the maximum-likelihood "
                         "strength is infinite; give prior > 0 (tied pseudo-games between every pair)")
    p = torch.ones(n, dtype=torch.float64)
    for _ in range(max_iter):
        new = total / (games / (p[:, None] + p[None, :])).sum(1)
        new = new / new.log().mean().exp()  # geometric mean 1
        done = float((new.log() - p.log()).abs().max()) < tol
        p = new
        if done:
            break
    return {pl: initial + scale * float(torch.log10(p[i])) for pl, i in idx.items()}


def length_controlled_win_rate(wins: Sequence[float], length_diffs: Sequence[float],
                               iters: int = 100) -> dict[str, float]:
    """A judge's win rate with the length bias taken out (RLHF book ch.16 / appendix B: AlpacaEval and WildBench
    "apply linear length correction"; AlpacaEval 2's length-controlled win rate, without its per-instruction term):
    fit P(win) = sigma(theta + phi * tanh(dl / sd(dl))) by maximum likelihood (Newton, soft targets), where dl is
    the length of the model's answer minus the baseline's; the length-controlled win rate is sigma(theta), the
    win rate the fit predicts at equal length.

    wins [n] in [0, 1] (a win 1, a tie 0.5, a loss 0), length_diffs [n] (tokens or characters)
    -> {"win_rate": the raw mean, "lc_win_rate", "theta", "phi"}."""
    if len(wins) != len(length_diffs) or len(wins) < 2:
        raise ValueError(f"length_controlled_win_rate: {len(wins)} verdicts for {len(length_diffs)} length differences "
                         "(equal, at least 2)")
    y = torch.tensor([float(w) for w in wins], dtype=torch.float64)
    if bool(((y < 0) | (y > 1)).any()):
        raise ValueError("length_controlled_win_rate: verdicts must be in [0, 1] (win 1, tie 0.5, loss 0)")
    dl = torch.tensor([float(d) for d in length_diffs], dtype=torch.float64)
    sd = float(dl.std(unbiased=False))
    t = torch.tanh(dl / sd) if sd > 0 else torch.zeros_like(dl)
    X = torch.stack([torch.ones_like(t), t], 1)  # [n, 2]
    w = torch.zeros(2, dtype=torch.float64)
    for _ in range(iters):
        p = torch.sigmoid(X @ w)
        grad = X.T @ (y - p)
        hess = X.T @ (X * (p * (1 - p))[:, None]) + 1e-9 * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hess, grad)
        w = w + step
        if float(step.abs().max()) < 1e-12:
            break
    return {"win_rate": float(y.mean()), "lc_win_rate": float(torch.sigmoid(w[0])), "theta": float(w[0]),
            "phi": float(w[1])}
