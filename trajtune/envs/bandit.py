"""The two-arm bandit of the iw-SFT paper (§3.5), and a tabular softmax policy for it.

    actions: pull-left (0), pull-right (1); one action per episode
    P(R = 1 | left) = 0.5,  P(R = 1 | right) = 1.0      (R in {0, 1})

The paper's point (REPRODUCE C1): data are collected once by a uniform reference
policy and filtered to R = 1. The filtered set holds right twice as often as left, so
SFT on it converges to pi(right) = 2/3, expected reward 5/6 — better than the
reference's 3/4, short of the optimum 1, because SFT "cannot incorporate knowledge
from failures". iw-SFT re-weights the same filtered data by q/pi_ref and does better
(C2). `filtered_action_distribution` gives the SFT fixed point in closed form.

The environment is tensor-level (actions and rewards, no tokens) and knows nothing
about policies; `TabularSoftmaxPolicy` is the bandit's "model": one logit per arm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

LEFT, RIGHT = 0, 1


@dataclass(frozen=True)
class TwoArmBandit:
    """Bernoulli rewards per arm; every draw comes from an explicit torch.Generator."""

    p_success: tuple[float, ...] = (0.5, 1.0)
    """P(R = 1) of each arm (left, right): the paper's 0.5 / 1.0"""

    @property
    def n_actions(self) -> int:
        return len(self.p_success)

    def pull(self, actions: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Rewards of one pull per entry. actions [N] long in [0, n_actions) -> rewards [N] float 0/1."""
        if actions.dim() != 1:
            raise ValueError(f"pull: actions must be [N], got {tuple(actions.shape)}")
        if len(actions) and (int(actions.min()) < 0 or int(actions.max()) >= self.n_actions):
            raise ValueError(f"pull: actions must lie in [0, {self.n_actions})")
        p = torch.tensor(self.p_success, dtype=torch.float32)[actions]  # [N]
        u = torch.rand(len(actions), generator=generator)
        return (u < p).float()

    def expected_reward(self, probs: torch.Tensor) -> float:
        """E[R] under a policy with action probabilities probs [n_actions]."""
        if probs.shape != (self.n_actions,):
            raise ValueError(f"expected_reward: probs must be [{self.n_actions}], got {tuple(probs.shape)}")
        return float((probs.detach().double() * torch.tensor(self.p_success, dtype=torch.float64)).sum())

    def filtered_action_distribution(self, ref_probs: torch.Tensor) -> torch.Tensor:
        """Distribution of actions in D+ = {a ~ pi_ref, R = 1}: pi_ref(a) P(R=1|a) / Z.

        ref_probs [n_actions] -> [n_actions]. This is where SFT on filtered data converges
        (the maximum-likelihood fit of D+); uniform pi_ref gives (1/3, 2/3) (paper §3.5).
        """
        joint = ref_probs.detach().double() * torch.tensor(self.p_success, dtype=torch.float64)
        return (joint / joint.sum()).to(ref_probs.dtype)


class TabularSoftmaxPolicy(nn.Module):
    """pi(a) = softmax(logits)[a] with one learnable logit per action; zeros = uniform."""

    def __init__(self, n_actions: int = 2, logits: torch.Tensor | None = None):
        super().__init__()
        init = torch.zeros(n_actions) if logits is None else logits.detach().clone().float()
        if init.shape != (n_actions,):
            raise ValueError(f"TabularSoftmaxPolicy: logits must be [{n_actions}], got {tuple(init.shape)}")
        self.logits = nn.Parameter(init)

    def log_probs(self) -> torch.Tensor:
        """[n_actions] log pi(a) for every action."""
        return torch.log_softmax(self.logits, dim=-1)

    def probs(self) -> torch.Tensor:
        """[n_actions] pi(a), detached."""
        return self.log_probs().detach().exp()

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """actions [N] long -> log pi(a_i) [N] (with grad)."""
        return self.log_probs()[actions]

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n actions drawn from pi -> [n] long."""
        return torch.multinomial(self.probs(), n, replacement=True, generator=generator)

    def frozen_copy(self) -> "TabularSoftmaxPolicy":
        """A detached copy (e.g. the time-lagged q of iw-SFT, or a frozen pi_ref)."""
        copy = TabularSoftmaxPolicy(len(self.logits), self.logits)
        copy.requires_grad_(False)
        return copy
