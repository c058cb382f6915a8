"""How far behind the trained policy a step's episodes were sampled: the per-step staleness metrics.

A loop that samples ahead of its updates (`trajtune.sources.overlap`, `sampling.max_staleness` K) trains at step s
(0-based: the trainer's weights have had s updates) on episodes whose POLICY tokens were sampled by earlier
weights; `Trajectory.versions` says, per token, how many updates the sampling weights had had. The staleness of a
POLICY token trained at step s is s - version, between 0 (on-policy) and K. `staleness_metrics` turns a step's
episodes into the numbers the step logs:

    staleness/mean, staleness/max   over the POLICY tokens the step trains on
    staleness/share_<k>             k = 0..K: the share of those tokens sampled k updates behind (the histogram)
    staleness/discarded_share       episodes sampled for the step but not trained on (the `discard` policy's waste)
    staleness/resumed_share         trained episodes whose POLICY tokens carry more than one version (a partial
                                    rollout's: interrupted at an update and continued under the new weights)
    staleness/length_bias           mean POLICY tokens per trained episode minus per sampled episode (< 0: the
                                    long episodes, the stale ones, are the ones thrown away)

The rule for unknown versions: an episode without `versions` (None) was sampled by the trained policy itself, so
its POLICY tokens are on-policy, staleness 0. An episode with `versions` must carry one (>= 0) on every POLICY
token: a -1 there (no policy version for a sampled token) or a version newer than the step is a stamping error, and
a trained token more than K behind breaks the bound; each raises a ValueError naming the episode. TEMPLATE, PROMPT
and TOOL tokens (-1: no policy sampled them) are not counted.

Pure functions of trajectories and counts; the overlapped source calls `staleness_metrics` once per step and adds
its row to the step's metrics. The episode records and `trajtune view` show the same versions token by token
(`trajtune.runs.recorder`, `trajtune.runs.view`).
"""

from __future__ import annotations

from typing import Sequence

from ..metrics import register
from ..trajectory import Owner, Trajectory

register("staleness/mean", "mean staleness of the POLICY tokens the step trains on: updates between the weights that "
         "sampled a token and the weights it is trained at (0: on-policy; sources.staleness)")
register("staleness/max", "the largest staleness of a POLICY token the step trains on (<= sampling.max_staleness)")
register("staleness/share_*", "staleness/share_<k>, k = 0..max_staleness: the share of the step's trained POLICY "
         "tokens sampled k updates behind (the staleness histogram; sources.staleness)")
register("staleness/discarded_share", "episodes sampled for the step but not trained on (too stale), over those "
         "sampled (sources.staleness)")
register("staleness/resumed_share", "share of the step's trained episodes whose POLICY tokens carry more than one "
         "policy version: partial rollouts, continued under newer weights (sources.staleness)")
register("staleness/length_bias", "mean POLICY tokens per trained episode minus per sampled episode: < 0 when the "
         "stale episodes thrown away are the long ones (sources.staleness)")


def token_staleness(t: Trajectory, step: int, index: int = 0) -> list[int]:
    """The staleness (`step` - version) of each POLICY token of `t` trained at loop step `step` (0-based updates
    so far), in order; all 0 when `t.versions` is None (see the module docstring's rule). `index` names the
    episode in errors."""
    if t.versions is None:
        return [0] * t.count(Owner.POLICY)
    out = []
    for i, (owner, version) in enumerate(zip(t.owners, t.versions, strict=True)):
        if owner != Owner.POLICY:
            continue
        if version < 0:
            raise ValueError(f"staleness: episode {index}'s POLICY token {i} has no policy version (-1) though the "
                             "episode carries versions: every sampled token must be stamped (Trajectory.stamp)")
        if version > step:
            raise ValueError(f"staleness: episode {index}'s POLICY token {i} has version {version}, newer than the "
                             f"step {step} that trains it")
        out.append(step - version)
    return out


def resumed(t: Trajectory) -> bool:
    """The episode's POLICY tokens carry more than one policy version (a partial rollout, continued under newer
    weights after an update)."""
    if t.versions is None:
        return False
    return len({v for v, o in zip(t.versions, t.owners, strict=True) if o == Owner.POLICY}) > 1


def staleness_metrics(sampled: Sequence[Trajectory], trained: Sequence[Trajectory], step: int,
                      max_staleness: int) -> dict[str, float]:
    """The step's staleness metrics (names and meaning: the module docstring).

    sampled:       every episode the source finished for this step, the ones a staleness policy dropped included
    trained:       those the step trains on (a subset of `sampled`)
    step:          the loop step that trains them, 0-based (the trainer's weights have had `step` updates)
    max_staleness: the bound K (`sampling.max_staleness`); a trained token more than K behind is a ValueError

    The histogram, mean and max are over the trained POLICY tokens (left out where there is none); the resumed
    share and the length bias are left out when nothing is trained; nothing sampled -> {}."""
    if max_staleness < 0 or step < 0:
        raise ValueError(f"staleness_metrics: step ({step}) and max_staleness ({max_staleness}) must be >= 0")
    if len(trained) > len(sampled):
        raise ValueError(f"staleness_metrics: {len(trained)} episodes trained on, more than the {len(sampled)} "
                         "sampled (trained must be a subset of sampled)")
    if not sampled:
        return {}
    out = {"staleness/discarded_share": (len(sampled) - len(trained)) / len(sampled)}
    if not trained:
        return out
    lags = [lag for i, t in enumerate(trained) for lag in token_staleness(t, step, i)]
    if lags and max(lags) > max_staleness:
        worst = next(i for i, t in enumerate(trained) if max(token_staleness(t, step, i), default=0) > max_staleness)
        raise ValueError(f"staleness: episode {worst} trained at step {step} has a POLICY token {max(lags)} updates "
                         f"behind, past the bound max_staleness {max_staleness}")
    if lags:
        out["staleness/mean"] = sum(lags) / len(lags)
        out["staleness/max"] = float(max(lags))
        for k in range(max_staleness + 1):
            out[f"staleness/share_{k}"] = lags.count(k) / len(lags)
    out["staleness/resumed_share"] = sum(map(resumed, trained)) / len(trained)

    def mean_length(ts: Sequence[Trajectory]) -> float:
        return sum(t.count(Owner.POLICY) for t in ts) / len(ts)

    out["staleness/length_bias"] = mean_length(trained) - mean_length(sampled)
    return out
