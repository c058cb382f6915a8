"""Agent post-training compared on one weak base in the BugFix gym (seed agent-rl ch.15; REPRODUCE A1-A13).

Every method below is the same weighted log-likelihood over POLICY tokens; they
differ in where the trajectories come from and what weight each gets. All start
from one *weak base* (format learned, no skill) and are measured the same way.

How this departs from the seed, and why:

    1. The gym is ours (`envs/bugfix.py`, `envs/bugfix_tasks.py`): the seed's 5 families, 20 train
       and 10 held-out tasks, actions and exploit. The held-out split is the seed's: unseen function
       names over the training tasks' repair cues (every other symbol of a held-out listing occurs in
       training, none pointing at another family). Harder variants of unseen code (an operator, a
       keyword, a loop-shaped `minmax` task no training listing shows) are a separate `novel` probe,
       and the `generalization` stage measures the final policies on it and on the training tasks
       under held-out names (`renamed`).
    2. The model is a TinyTransformer (dim 64 x 2 layers x 4 heads) over the gym's word vocabulary,
       not the seed's `TinyAgent`, with an untied output layer (`tied=False`): tied (GPT-2's layout),
       a held-out name, a token no training input shows, is still moved by every output softmax
       (norm ~1.0 after the weak base, like a trained token's) and oracle SFT learns about half as
       fast (seed 0, train pass at SFT step 20: 0.57 tied, 0.88 untied in a side run).
    3. The blind policy of the weak base's data guesses one op per seed, whatever the task; it used to
       guess one op per (seed, function name), which taught the weak base that the name predicts the
       edit (oracle SFT from it, seed 0: 0.85 on the training tasks renamed, 1.00 without).
    4. The weak base sees 32 episodes of each scripted policy per task (1,280), not the seed's 4 (160):
       160 episodes over 150 steps are each seen ~30 times, and the base's action entropy falls to
       0.17-0.39 (0.5-0.6 with 1,280), a prior oracle SFT first has to unlearn. And every training
       function's parameter names belong to its family alone (`fits(x, capacity)`, not `size`, which the
       zero family takes): with a shared name a student picked the edit from it. Together they move the
       cold start (oracle SFT step 20, train pass, seeds 0/1/2) from 0.61/0.53/0.25 to 0.91/0.93/0.94.
    5. The optimizer is the library's AdamW (betas 0.9 / 0.95, grad-norm clip 1.0, no weight decay; the
       seed: torch's defaults, betas 0.9 / 0.999, weight decay 0.01, no clip), both at the seed's constant
       learning rates (SFT 3e-3, DPO and RL 1e-3). The seed's settings learn oracle SFT more slowly here
       (seed 1, train pass at step 20: 0.40 against 0.54; seed 2: 0.39 against 0.62).
    6. Training goes through the library's loops (`algorithms/`), not the seed's hand-written ones:
       an SFT batch is drawn without replacement and is a function of (seed, step) (the seed samples
       with replacement), and batches are forwarded in 4 groups of similar length (the same gradient
       up to float rounding).
    7. One `seed` derives every loop's seed (`bugfix.seeded`), and every evaluation point samples
       with the same random numbers, so curves compare policies, not draws.
    8. Like the seed's, the weak base has a blind spot: its blind and random play never edit with
       `fix_init` (`weak_blind_spot`), so the base never solves the `init` family and expert iteration
       can only grow inside what the base reaches (A5's bound). With every op in its play our base solved
       15-18 of the 20 tasks in RFT's first round and the later rounds the rest (train 0.99): no bound to
       hit. Which family is held back does not matter to the bound (each of init, zero, minmax, range:
       RFT flattens at 0.69-0.76 below the 0.80 the base reaches, seeds 0-2). A5's bound is the share of
       tasks the base solves in `coverage_samples` (64) samples each, where the seed read it off RFT's
       first round (16 each): with 16, our base finds 13-16 of the 16 tasks it can solve.

The stages (`STAGES`; dependencies first, independent ones in `runner.workers` processes):

    weak_base          SFT on blind + random scripted play                      A2
    oracle_sft         SFT on 20 oracle demos, eval + snapshot every 10 steps   A3, A10
    rft                expert iteration, 4 rounds (own samples, 0/1 filter)     A5, A12
    dpo, dpo_nll       offline DPO on weak-base pairs, and DPO + NLL            A7, A8
    sft_rl, rl_only    REINFORCE with a group baseline from the step-20 SFT
                       snapshot, and from the weak base (equal total steps)     A9
    diagnostics        owners and masked loss at init; gradient identity;
                       dpo_loss sanity                                          A1, A4, A6
    template_mismatch  SFT on demos rendered without wrapper tokens             A11
    hacking            expert iteration filtered by the public tests            A13
    generalization     the final policies on the train tasks under held-out     (beyond the
                       names and on the `novel` split (unseen code)             seed)

What each shows, and the seed-0 numbers to expect on an AVX-512 CPU. Every comparison is decided with its
uncertainty (`runs/verdicts.py`: a difference must clear 2 standard errors, binomial over the episodes evaluated;
inside them it is "not distinguishable"), so one seed judges 11 of 13 (A8 and A9 inside the noise);
`--seeds 0,1,2,3,4 --kernels avx512,avx2` pools every claim over the seeds on each float path (docs/experiments.md):

    A1   a minority of predicted tokens are actions; masked and unmasked loss ~ log V at init
    A2   the weak base has the format (invalid/ep < 0.1) and no skill (pass not above guess level, 0.2, by 2 SE)
    A3   oracle SFT learns the train tasks and transfers to unseen names (0.16/0.15 -> 1.00/0.91,
         action entropy 0.54 -> 0.006)
    A4   the 0/1 policy gradient equals the scaled SFT gradient on the kept episodes (to 5e-9)
    A5   expert iteration rises and flattens below the 16/20 tasks the base reaches (0.16 -> 0.61 -> 0.70
         -> 0.74 -> 0.72; `init` never solved), on blind guesses (75% of round 0's kept start with an
         edit), its held-out at guess level (0.25 over the four rounds' 160 episodes, +0.05 ± 0.07 above 0.2).
         The issue names the function only ("fix the bug in NAME"), as the seed's: a held-out name's embedding
         row is never trained, so the policy's blind edit on it is a draw (seed 0: guard_zero on 79% of
         held-out episodes, pass 0.20); on other seeds two stacked blind edits (a wrong op leaves the
         listing unchanged) or a lucky draw lift one seed's held-out (docs/experiments.md)
    A6   dpo_loss 0.6931 / 0.1269 / 2.1269 at margins 0 / +4 / -4
    A7   DPO pushes the rejected log-prob down ~45 nats; malformed calls rise 0.00 -> 2.31 per episode at their
         peak (0.57 at the end), held-out 0.15 -> 0.25 is inside the noise (+0.10 ± 0.18): holds
    A8   DPO + NLL keeps the format (fewer malformed calls, higher train pass than A7): on seed 0 its malformed
         calls (0.60 against 0.57) are not distinguishable
    A9   SFT 1.00/0.90 ~ SFT -> RL 0.96/0.82 >> RFT 0.72/0.23 on held-out, and SFT -> RL >> RL only
         (0.59/0.55); the cold start at step 20 passes 0.93/0.85 (the seed's 0.80/0.85). On one seed the
         held-out gap to RL only (+0.28 ± 0.20 against the 0.2 margin, 40 episodes each) is not distinguishable
    A10  long SFT leaves few informative groups (0.50 / 0.40 / 0.00; the seed's 0.60 / 0.70 / 0.10)
    A11  SFT on demos without wrapper tokens fails in the real rollout format (train 0.19), not by the
         seed's mechanism (malformed calls 0.00/ep, seed 0.62: the report says so)
    A12  dedup of the RFT kept set changes the family shares (total variation 0.10)
    A13  the public-test filter breeds reward hacks (68% -> 86% -> 88% of kept episodes) while hidden
         pass stalls

Each stage writes its checkpoint to run_dir/<stage>/checkpoint, its results to
run_dir/<stage>/results.json and its metric rows (stage name in each) to
run_dir/metrics.jsonl (`trajtune.runs.stages`); a finished stage is reused, one cut short
by Ctrl-C resumes from run_dir/<stage>/resume, and a rerun of one stage is
`--set 'config.runner.rerun=["dpo"]'`. `report.py` writes the report: claims beside
the seed's numbers, learning curves, cost table.

    stages.py       the stage functions        report.py   the report: tables, plots, the seeds report
    diagnostics.py  A1, A4, A6 and A11's NLL   claims.py   claims A1-A13 and the four conclusions, checked
    kernels.py      its own option --kernels   ../bugfix.py  the gym, measurements, weak base (shared with iw-SFT)
                    (the seeds on several CPU kernel sets)
"""

from __future__ import annotations

import functools
import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...algorithms.dpo import DPOConfig
from ...algorithms.rft import RFTConfig
from ...algorithms.rl import RLConfig
from ...algorithms.sft import SFTConfig
from ...config import check_ranges
from ...engine.distributed import is_main
from ...engine import OptimConfig
from ...envs.bugfix_tasks import FAMILIES
from ...models.tiny import TinyConfig
from ...runs.stages import Stage, StageOptions, run_stages
from ...runs.view import write_view_if_recorded
from ...sources.sampling import MOVED, OVERLAP, SamplingConfig, check_sampling
from ..base import Call
from . import stages as st
from .kernels import parse_options, run_under_kernels  # noqa: F401 (parse_options: the Experiment member)
from .stages import GENERALIZATION


@dataclass
class Config:
    RENAMED: ClassVar[dict[str, str]] = {
        "overlap": MOVED["overlap"],
        "sft_lr": "sft_optim.lr",
        "dpo_lr": "dpo_optim.lr",
        "rl_lr": "rl_optim.lr",
        "dpo_eval_every": "dpo.eval_every",
        "rl_eval_every": "rl.eval_every",
        "workers": "runner.workers",
        "threads": "runner.threads",
        "checkpoint_every": "runner.checkpoint_every",
        "stages": "runner.rerun",
    }
    """recipe keys of earlier versions -> where they went (a clear error names the new key)"""
    seed: int = 0
    """one seed: model init, scripted play, sampling and batches of every stage derive from it
    (the `seed` fields of the nested loop configs are overwritten with it)"""
    dim: int = 64
    """model width (TinyTransformer)"""
    n_layers: int = 2
    """transformer blocks"""
    n_heads: int = 4
    """attention heads"""
    tied: bool = False
    """tie the output layer to the token embedding (GPT-2's layout). Untied by default: tied, a held-out
    function name (a token no training input shows) is moved by every output softmax and oracle SFT
    learns about half as fast (`experiments.bugfix.new_model`)"""
    positions: str = "learned"
    """how the model sees token positions: "learned" (absolute, GPT-2), "rope" or "none"
    (`models.tiny.TinyConfig.positions`). The weak base keys its next action partly on the absolute
    position (docs/experiments.md, issue 15's cold start); rope or none removes that cue but does not give a
    stronger cold start: SFT@20 train/held-out on seeds 0/1/2, learned 0.91/0.72, 0.93/0.90,
    0.94/0.82; rope 0.90/0.75, 0.88/0.82, 0.57/0.53; none 0.79/0.70, 0.75/0.65, 0.76/0.68. Over 3 seeds rope holds
    fewer claims (A3 2/3, A5 0/3, A9 1/3, A10 2/3, A11 1/3, A12 2/3; the rest 3/3)"""
    max_turns: int = 6
    """policy turns per episode"""
    max_action_tokens: int = 8
    """token budget of one action (valid actions need at most 3)"""
    episode_seeds: bool = False
    """every sampled episode draws from its own generator, so its actions do not depend on which batch or
    process ran it; implied under torchrun (set it here to get a one-process run equal to a torchrun one)"""
    weak_play_seeds: int = 32
    """weak base data: this many seeds of the blind and of the random policy x 20 train tasks (32 -> 1,280
    episodes). The seed's 160 (4 seeds) are seen ~30 times each in the 150 steps, and the base learns each
    task's own scripted episodes by heart (action entropy 0.17-0.39 against 0.5-0.6 with 1,280), a prior
    oracle SFT must first unlearn: train pass at SFT step 20 on seeds 0/1/2 was 0.79/0.64/0.70 with 160,
    0.91/0.93/0.94 with 1,280 (`experiments.bugfix.train_weak_base`)"""
    weak_blind_spot: str = "init"
    """a task family whose op the weak base's blind and random play never use ("": none), so the base never solves
    it, as the seed's base never solves `init`: RFT's kept set can then only grow inside what the base reaches, the
    bound A5 tests (`experiments.bugfix.train_weak_base`). With every op (""), the base solves 15-18 of the 20
    tasks in RFT's first round and A5's bound is not there to hit"""
    coverage_samples: int = 64
    """A5's bound: episodes of every train task sampled from the weak base; the tasks any of them solves are what
    expert iteration from it can reach (the seed reads them off RFT's first round of 16 per task; with 16 our base
    solves fewer of the tasks it can solve; 0: RFT's first round, as the seed)"""
    weak: SFTConfig = field(default_factory=lambda: SFTConfig(steps=150, batch_size=32, length_buckets=4))
    """SFT on blind + random play (A2)"""
    oracle: SFTConfig = field(default_factory=lambda: SFTConfig(steps=60, batch_size=32, eval_every=10,
                                                                length_buckets=4))
    """SFT on the 20 oracle demos from the weak base (A3; also the A11 mismatch run); snapshot every eval"""
    sft_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3))
    """optimizer of every SFT-style stage (weak base, oracle SFT, RFT rounds, A11, A13)"""
    cold_start_step: int = 20
    """the oracle-SFT snapshot that SFT -> RL starts from (A9) and A10 probes"""
    rft: RFTConfig = field(default_factory=lambda: RFTConfig(rounds=4, samples_per_task=16, steps_per_round=15,
                                                              length_buckets=4))
    """expert iteration from the weak base (A5)"""
    hack_rounds: int = 3
    """rounds of expert iteration filtered by public tests (A13); other settings as `rft`"""
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(steps=100, beta=0.1, eval_every=25, length_buckets=4))
    """offline DPO, full batch (A7); the DPO + NLL stage adds `dpo_nll_weight` (A8)"""
    dpo_nll_weight: float = 1.0
    """weight of the NLL on chosen episodes in the dpo_nll stage"""
    dpo_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    """optimizer of the DPO stages"""
    pair_samples: int = 16
    """weak-base episodes per train task from which preference pairs are made"""
    rl: RLConfig = field(default_factory=lambda: RLConfig(steps=60, tasks_per_step=8, group_size=8, eval_every=10,
                                                           length_buckets=4))
    """REINFORCE with a group-mean baseline; RL only runs `rl.steps`, SFT -> RL runs `rl.steps - cold_start_step`"""
    rl_optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))
    """optimizer of the RL stages"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """where the RL stages sample (max_staleness 1: the next step in a sampler process while this one trains, with
    rl.tis_cap > 0; sampler_process: there, on-policy)"""
    eval_samples: int = 4
    """episodes per task at every evaluation point (80 train, 40 held-out)"""
    describe_samples: int = 8
    """episodes per task for a stage's final description (pass, invalid, reads, entropy)"""
    probe_group: int = 8
    """A10: episodes per held-out task when counting groups with reward variance"""
    runner: StageOptions = field(default_factory=StageOptions)
    """stage processes (workers=2), torch threads per process (threads=1: the model is too small to gain
    from more, and OpenMP spin-waiting makes 2 threads many times slower whenever another process is
    busy), checkpoint_every (0: only on Ctrl-C / SIGTERM), rerun (stages to run again)"""

    def __post_init__(self) -> None:
        check_sampling(self.sampling, "agent", rl=self.rl, backends=("sampler",), reads=OVERLAP)
        unknown = set(self.runner.rerun) - set(STAGE_NAMES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; known: {', '.join(STAGE_NAMES)}")
        if self.weak_blind_spot not in ("", *FAMILIES):
            raise ValueError(f"agent: weak_blind_spot must be one of {', '.join(FAMILIES)} or \"\" (none); got "
                             f"{self.weak_blind_spot!r}")
        if not 0 < self.cold_start_step < self.rl.steps:
            raise ValueError("cold_start_step must be between 0 and rl.steps")
        check_ranges(self, "agent",
                     counts=("dim", "n_layers", "n_heads", "max_turns", "max_action_tokens", "weak_play_seeds",
                             "pair_samples", "eval_samples", "describe_samples", "probe_group"),
                     non_negative=("hack_rounds", "dpo_nll_weight", "coverage_samples"))
        try:  # the model's own checks of dim, n_heads and positions, before any stage starts
            TinyConfig(1, self.dim, self.n_layers, self.n_heads, positions=self.positions)
        except ValueError as e:
            raise ValueError(f"agent: {str(e).removeprefix('TinyConfig: ')}") from None


STAGES: list[Stage] = [  # priority order; `reads`: the config fields each stage function reads (`Stage.reads`)
    Stage("weak_base", st.weak_base,
          reads=("coverage_samples", "describe_samples", "dim", "episode_seeds", "max_action_tokens", "max_turns",
                 "n_heads", "n_layers", "positions", "seed", "sft_optim", "tied", "weak", "weak_blind_spot",
                 "weak_play_seeds")),
    Stage("oracle_sft", st.oracle_sft, after=("weak_base",),
          reads=("cold_start_step", "describe_samples", "episode_seeds", "eval_samples", "max_action_tokens",
                 "max_turns", "oracle", "probe_group", "seed", "sft_optim")),
    Stage("rl_only", st.rl_only, after=("weak_base",),
          reads=("describe_samples", "episode_seeds", "eval_samples", "max_action_tokens", "max_turns", "sampling",
                 "rl", "rl_optim", "seed")),
    Stage("sft_rl", st.sft_rl, after=("oracle_sft",),
          reads=("cold_start_step", "describe_samples", "episode_seeds", "eval_samples", "max_action_tokens",
                 "max_turns", "sampling", "rl", "rl_optim", "seed")),
    Stage("dpo", st.dpo, after=("weak_base",),
          reads=("dpo", "dpo_optim", "episode_seeds", "eval_samples", "max_action_tokens", "max_turns",
                 "pair_samples", "seed")),
    Stage("dpo_nll", st.dpo_nll, after=("weak_base",),
          reads=("dpo", "dpo_nll_weight", "dpo_optim", "episode_seeds", "eval_samples", "max_action_tokens",
                 "max_turns", "pair_samples", "seed")),
    Stage("rft", st.rft, after=("weak_base",),
          reads=("describe_samples", "episode_seeds", "eval_samples", "max_action_tokens", "max_turns", "rft",
                 "seed", "sft_optim")),
    Stage("hacking", st.hacking, after=("weak_base",),
          reads=("episode_seeds", "eval_samples", "hack_rounds", "max_action_tokens", "max_turns", "rft", "seed",
                 "sft_optim")),
    Stage("template_mismatch", st.template_mismatch, after=("weak_base",),
          reads=("describe_samples", "episode_seeds", "max_action_tokens", "max_turns", "oracle", "seed",
                 "sft_optim")),
    Stage("diagnostics", st.diagnostics, after=("weak_base",),
          reads=("dim", "episode_seeds", "eval_samples", "max_action_tokens", "max_turns", "n_heads", "n_layers",
                 "positions", "seed", "sft_optim", "tied")),
    Stage("generalization", st.generalization, after=GENERALIZATION,
          reads=("describe_samples", "episode_seeds", "max_action_tokens", "max_turns", "seed", "sft_optim")),
]
STAGE_NAMES = [s.name for s in STAGES]


def stage_results(config: Config, run_dir: Path, meanwhile=None) -> dict[str, dict]:
    """Every stage's results: finished stages read back, the others (and `runner.rerun`) run
    (`meanwhile`: `stages.run_stages`')."""
    return run_stages(STAGES, config, Path(run_dir), config.runner, meanwhile=meanwhile)


def run(config: Config, run_dir: Path) -> Path:
    """The whole comparison for one seed -> path of report.md."""
    from .report import write_agent_report

    run_dir = Path(run_dir)
    print(f"agent comparison (seed {config.seed}): {len(STAGES)} stages, {config.runner.workers} worker(s)", flush=True)
    t0 = time.perf_counter()
    # this process only waits on its workers: it imports the plotting meanwhile
    results = stage_results(config, run_dir, meanwhile=functools.partial(importlib.import_module, f"{__name__}.report"))
    if not is_main():  # under torchrun rank 0 writes the report
        return run_dir / "report.md"
    write_view_if_recorded(run_dir)  # view.html first: the report links it
    return write_agent_report(config, run_dir, results, time.perf_counter() - t0)


def seeds_report(config: Config, run_dir: Path, per_seed: dict[int, Path],
                 float_paths: dict[str, dict[int, Path]] | None = None) -> Path:
    """`trajtune run --seeds`: the mean +- sd report in run_dir of the per-seed runs (`trajtune.runs.rundir.run_seeds`:
    seed -> its run directory). `float_paths` (`--kernels`): CPU kernel set -> seed -> run directory; the report then
    gives each claim's verdict on every (seed, kernel set)."""
    from .report import write_seeds_report

    def read(dirs: dict[int, Path]) -> dict[int, dict]:
        return {s: json.loads((Path(d) / "summary.json").read_text()) for s, d in dirs.items()}

    return write_seeds_report(Path(run_dir), read(per_seed),
                              {t: read(dirs) for t, dirs in (float_paths or {}).items()} or None)


def run_over_seeds(config: Config, run_dir: Path, seeds: list[int], call: Call) -> Path | None:
    """`trajtune run agent --seeds S,S [--kernels K,K]`: every seed here into run_dir/seed-<s>, then (--kernels) again
    under each other CPU kernel set in a child run into run_dir/kernels-<k>/seed-<s> -> the seeds report."""
    from ...runs.rundir import run_seeds

    per_seed = run_seeds(run, config, run_dir, seeds)
    kernels = getattr(call.options, "kernels", None)
    paths = None
    if kernels:
        paths = {kernels[0]: per_seed}
        for k in kernels[1:]:
            paths[k] = run_under_kernels(k, call.recipe, call.overrides, Path(run_dir) / f"kernels-{k}", seeds)
    return seeds_report(config, run_dir, per_seed, float_paths=paths) if is_main() else None


# the experiment contract (`trajtune.experiments.base.Experiment`): what it offers beyond one run (and
# `run_over_seeds`, `parse_options`: --kernels, kernels.py)
dry_run = None  # `trajtune run --dry-run`: the run directory's checks alone
