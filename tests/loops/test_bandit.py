"""The iw-SFT paper's two-arm bandit (§3.5; REPRODUCE C1/C2).

Setup, as in the paper: the data come from the uniform reference policy pi_ref (we
"observe the behaviour of the system only by watching" it), are filtered to R = 1,
and the policy is fitted to them. Each round draws a fresh batch from pi_ref, filters
it and fits the policy by gradient descent on the shipped losses; iw-SFT's q is the
policy at the start of the round (a time-lagged copy, paper eq. 10).

Fixed points (closed form, for the test tolerances): the fit of weighted data is
pi(a) proportional to sum of weights of a in D+, and D+ holds right:left = 2:1, so
    SFT:               pi(right) = 2/3, reward 5/6                 (paper §3.5)
    iw-SFT, clip:      pi(R)/pi(L) = 2 clip(2 q(R)) / clip(2 q(L)) -> 2 * 1.8 / 0.2 = 18,
                       pi(right) = 18/19 = 0.947, reward 0.974
    iw-SFT, smooth a:  pi(R)/pi(L) = 2 (q(R)/q(L))^a -> 2^(1/(1-a)); a = 0.5: 0.8, reward 0.9
"""

import pytest
import torch

from trajtune.envs.bandit import LEFT, RIGHT, TabularSoftmaxPolicy, TwoArmBandit
from trajtune.objectives.importance import iw_sft_weights
from trajtune.objectives.sft import sft_loss, weighted_sft_loss


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: thread hand-offs cost more than the math on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def train_on_filtered(method: str, rounds: int = 8, n: int = 20_000, steps: int = 40, lr: float = 4.0,
                      seed: int = 0, sample_from: str = "reference", **iw) -> tuple[TabularSoftmaxPolicy, list]:
    env = TwoArmBandit()
    g = torch.Generator().manual_seed(seed)
    policy = TabularSoftmaxPolicy(2)  # uniform start
    ref = policy.frozen_copy()  # pi_ref: uniform, the data collector
    opt = torch.optim.SGD(policy.parameters(), lr=lr)
    history = []
    for _ in range(rounds):
        q = policy.frozen_copy()  # the time-lagged copy
        # 1. sample (from pi_ref as in the paper, or from the current policy: expert iteration)
        actions = (ref if sample_from == "reference" else q).sample(n, g)
        # 2. filter: keep R = 1
        kept = actions[env.pull(actions, g) == 1]  # [K]
        mask = torch.ones(len(kept), 1)  # one POLICY token per episode: [K, 1]
        weights = None
        if method == "iw":
            weights, _ = iw_sft_weights(q.log_prob(kept)[:, None], ref.log_prob(kept)[:, None], mask, **iw)
        # 3. fit
        for _ in range(steps):
            logp = policy.log_prob(kept)[:, None]  # [K, 1]
            loss = sft_loss(logp, mask)[0] if weights is None else weighted_sft_loss(logp, mask, weights)[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
        p = policy.probs()
        history.append((round(p[RIGHT].item(), 4), round(env.expected_reward(p), 4)))
    return policy, history


def test_env_is_seeded_and_matches_the_paper():
    env = TwoArmBandit()
    a = torch.tensor([LEFT, RIGHT] * 5000)
    r1 = env.pull(a, torch.Generator().manual_seed(3))
    assert torch.equal(r1, env.pull(a, torch.Generator().manual_seed(3)))
    assert r1[a == RIGHT].min() == 1.0
    assert r1[a == LEFT].mean().item() == pytest.approx(0.5, abs=0.03)
    assert env.expected_reward(torch.tensor([0.5, 0.5])) == pytest.approx(0.75)
    d_plus = env.filtered_action_distribution(torch.tensor([0.5, 0.5]))
    assert torch.allclose(d_plus, torch.tensor([1 / 3, 2 / 3]))
    with pytest.raises(ValueError):
        env.pull(torch.tensor([2]), torch.Generator())


def test_sft_on_filtered_data_converges_to_two_thirds():
    policy, history = train_on_filtered("sft")
    p_right, reward = history[-1]
    print(f"\nC1 SFT on filtered pi_ref data: pi(right), reward per round {history}")
    assert p_right == pytest.approx(2 / 3, abs=0.02)
    assert reward == pytest.approx(5 / 6, abs=0.02)


def test_iw_sft_with_the_papers_clipping_beats_sft():
    policy, history = train_on_filtered("iw", variant="clip", step_clip=(0.2, 1.8))
    p_right, reward = history[-1]
    print(f"\nC2 iw-SFT (per-step clip 0.2/1.8): {history}")
    assert history[0][0] == pytest.approx(2 / 3, abs=0.02)  # round 1: q = pi_ref, weights 1 = SFT
    assert reward >= 0.9
    assert p_right == pytest.approx(18 / 19, abs=0.02)


def test_iw_sft_smoothing_moves_between_sft_and_the_optimum():
    results = {}
    for alpha in (0.0, 0.5, 1.0):
        _, history = train_on_filtered("iw", variant="smooth", alpha=alpha)
        results[alpha] = history[-1]
    print(f"\nC2 iw-SFT smoothing exp(alpha * rho): final (pi(right), reward) per alpha {results}")
    assert results[0.0][0] == pytest.approx(2 / 3, abs=0.02)  # alpha -> 0: plain SFT
    assert results[0.5][0] == pytest.approx(0.8, abs=0.02)
    assert results[1.0][1] > 0.97  # unsmoothed weights: towards the optimum


def test_filtering_the_policys_own_samples_is_expert_iteration_not_the_papers_fixed_point():
    """Sampling each round from the *current* policy (RFT) does not stop at 2/3:
    pi(right) follows p -> p / (p + (1 - p)/2), i.e. 1/2, 2/3, 4/5, 8/9, ... -> 1."""
    _, history = train_on_filtered("sft", sample_from="policy", rounds=6)
    print(f"\nSFT on the policy's own filtered samples (expert iteration): {history}")
    expected = [2 ** (k + 1) / (2 ** (k + 1) + 1) for k in range(6)]
    assert [h[0] for h in history] == pytest.approx(expected, abs=0.02)
