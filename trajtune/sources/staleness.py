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

What happens to the episodes a slow rollout makes stale is the policy `sampling.stale` (`trajtune.sources.overlap`),
decided exactly on a virtual clock rather than on wall time: the sampler decodes its draw's episodes in lockstep
(one token of every running episode per decode step, turn by turn), and `sampling.tokens_per_update` decode steps
take as long as one update of the trainer. `decode_clock` gives each episode's clock at its last POLICY token;
its duration in updates is that over tokens_per_update. A draw of step s started at version v (s - K, or 0 in the
first steps) arrives at update v + duration:

    pace     (admission control) the trainer waits for every episode; nothing is thrown away
    discard  a group that arrives after its step trains (duration > s - v) is dropped (Outcome.STALE, kept for
             the counts and the viewer): what TRL's and Tinker's async loops do, which starves the slow problems
    partial  nothing is dropped; an episode's tokens past each update boundary are sampled with the newer weights
             (several versions per episode: the resumed share)

Pure functions of trajectories and counts; the overlapped source calls `staleness_metrics` once per step and adds
its row to the step's metrics. The episode records and `trajtune view` show the same versions token by token
(`trajtune.runs.recorder`, `trajtune.runs.view`).
"""

from __future__ import annotations

from typing import Sequence

from ..metrics import register
from ..trajectory import Outcome, Owner, Trajectory

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


def actions(t: Trajectory) -> list[int]:
    """The POLICY tokens of each of `t`'s actions (its turns with POLICY tokens), in order."""
    counts: dict[int, int] = {}
    for owner, turn in zip(t.owners, t.turns, strict=True):
        if owner == Owner.POLICY:
            counts[turn] = counts.get(turn, 0) + 1
    return [counts[turn] for turn in sorted(counts)]


def lockstep(trajs: Sequence[Trajectory]) -> tuple[list[list[int]], list[int]]:
    """One draw's episodes decoded in lockstep: per episode its actions' POLICY token counts (`actions`), and per
    action index k the decode steps the batch took before action k (action j of every episode still running is
    decoded together, taking as many steps as the longest of them)."""
    lengths = [actions(t) for t in trajs]
    longest: list[int] = []
    for acts in lengths:
        for k, n in enumerate(acts):
            if k == len(longest):
                longest.append(0)
            longest[k] = max(longest[k], n)
    offsets = [0]
    for n in longest:
        offsets.append(offsets[-1] + n)
    return lengths, offsets


def decode_clock(trajs: Sequence[Trajectory]) -> list[int]:
    """Per episode of one draw, the decode steps its batch had taken when the episode's last POLICY token was drawn
    (`lockstep`): the steps before its last action plus that action's length (single-turn: its own length). 0 for
    an episode without POLICY tokens."""
    lengths, offsets = lockstep(trajs)
    return [offsets[len(acts) - 1] + acts[-1] if acts else 0 for acts in lengths]


def discard_stale(trajs: Sequence[Trajectory], behind: int, tokens_per_update: int) -> int:
    """The `discard` policy on one draw sampled `behind` updates before the step that trains it: every episode of a
    group whose longest episode lasted more than `behind` updates (clock // tokens_per_update: it arrives after its
    step trained) is marked Outcome.STALE (the OK ones; a failed episode keeps its outcome). -> episodes marked."""
    if tokens_per_update < 1:
        raise ValueError(f"discard_stale: tokens_per_update must be >= 1, got {tokens_per_update}")
    duration: dict[int, int] = {}
    for t, clock in zip(trajs, decode_clock(trajs), strict=True):
        duration[t.group] = max(duration.get(t.group, 0), clock // tokens_per_update)
    marked = 0
    for t in trajs:
        if duration[t.group] > behind and t.outcome is Outcome.OK:
            t.outcome = Outcome.STALE
            marked += 1
    return marked
