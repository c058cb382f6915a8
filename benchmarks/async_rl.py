"""Overlapped RL (RLConfig.max_staleness = 1) vs the synchronous loop: wall time of the same RL run.

    python benchmarks/async_rl.py                     # both workloads, 2 alternating repeats each
    python benchmarks/async_rl.py --workloads agent --steps 8 --repeats 1

Workloads:
  agent  the agent experiment's RL-only stage (its RLConfig and rl_optim: REINFORCE, 8 tasks x 8
         episodes of up to 6 turns on the BugFix gym, length buckets 4) from a weak base SFT'd here on
         scripted blind + random play (`--weak-steps`), without the stage's evaluations
  hf     `trajtune grpo` (trajtune.experiments.hf.grpo.run) on a random tiny Llama: 8 prompts x 8
         completions of up to 8 new tokens (vs_trl.py's GRPO row), a reward function, the run's files and report

Both loops run with tis_cap 2 (the overlapped loop needs it; on-policy it is a weight ~1). Threads:
the synchronous run on one torch thread (what the stage runner gives a stage); the overlapped run
with the trainer on one thread and the sampler process on one (`sampler_threads`), i.e. one core
each on a 2-core machine. Runs alternate (sync, async, sync, async ...) so background load hits
both alike; the load average is printed before and after. s/step is the median interval between
consecutive logged steps after the first (the first step holds the start-up: the sampler process,
the first batch); "run" is the whole call, start-up included. The last columns say how much of a
synchronous step is collecting (sampling, environments, rewards) and the speed-up that perfect
overlap of collecting and training would give.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import torch  # noqa: E402


def agent_run(weak_state: dict, staleness: int, steps: int) -> tuple[list[float], float, float]:
    """The RL-only stage's loop from the weak base -> (step end times, whole-run seconds, collect seconds)."""
    from trajtune.algorithms.rl import train_rl
    from trajtune.engine import make_engine
    from trajtune.experiments.agent import Config as AgentConfig
    from trajtune.experiments.bugfix import Gym, new_model

    c = AgentConfig()
    gym = Gym(c.max_turns, c.max_action_tokens)
    model = new_model(c.seed, gym, c.dim, c.n_layers, c.n_heads)
    model.load_state_dict(weak_state)
    engine = make_engine(model, c.rl_optim)
    cfg = dataclasses.replace(c.rl, steps=steps, eval_every=0, tis_cap=2.0, max_staleness=staleness)
    run = Clocked("rl_only")
    t0 = time.perf_counter()
    train_rl(engine, gym.train, gym.collect(engine), cfg, gym.pad_id, run=run)
    return run.times, time.perf_counter() - t0, gym.counters["sampling_s"]


def weak_base(steps: int) -> dict:
    """A weak base like the agent experiment's (A2): SFT of a fresh model on blind + random scripted play."""
    from trajtune.algorithms.sft import train_sft
    from trajtune.engine import make_engine
    from trajtune.experiments.agent import Config as AgentConfig
    from trajtune.experiments.bugfix import Gym, new_model, scripted_play

    c = AgentConfig()
    gym = Gym(c.max_turns, c.max_action_tokens)
    seeds = list(range(c.weak_play_seeds))
    play = scripted_play(gym, "blind", seeds, gym.train) + scripted_play(gym, "random", seeds, gym.train)
    engine = make_engine(new_model(c.seed, gym, c.dim, c.n_layers, c.n_heads), c.sft_optim)
    train_sft(engine, play, dataclasses.replace(c.weak, steps=steps), gym.pad_id)
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


def hf_files(d: Path) -> Path:
    from trajtune.models.hf_random import make_random_model

    model = make_random_model(d / "model", "llama", "tiny")
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(64):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}], "answer": str(i + 5)}) + "\n")
    (d / "rewards.py").write_text("def has_answer(prompts, completions, answer, **kw):\n"
                                  "    return [float(a in c[-1]['content']) for c, a in zip(completions, answer)]\n")
    return model


def hf_run(d: Path, model: Path, staleness: int, steps: int, out: Path) -> tuple[list[float], float, float]:
    """`trajtune grpo` -> (step end times from metrics.jsonl, whole-run seconds, collect seconds: sampling + rewards)."""
    from trajtune.algorithms.rl import RLConfig
    from trajtune.engine import OptimConfig
    from trajtune.experiments.hf.common import OutputConfig
    from trajtune.experiments.hf.grpo import GRPORun, run
    from trajtune.experiments.hf.model import ModelConfig
    from trajtune.experiments.hf.sampling import SamplingConfig
    from trajtune.metrics import read_metrics

    config = GRPORun(model=ModelConfig(path=str(model)), data=str(d / "prompts.jsonl"),
                     reward=[f"{d / 'rewards.py'}:has_answer"],
                     rl=RLConfig(steps=steps, tasks_per_step=8, group_size=8, advantage="grpo", aggregation="sequence",
                                 tis_cap=2.0, max_staleness=staleness),
                     sampling=SamplingConfig(max_new_tokens=8), optim=OptimConfig(lr=1e-5),
                     output=OutputConfig(logging_steps=0))
    t0 = time.perf_counter()
    run(config, out)
    wall = time.perf_counter() - t0
    spent = json.loads((out / "grpo" / "results.json").read_text())["time"]
    return [r["time"] for r in read_metrics(out) if r.get("stage") == "grpo"], wall, spent["sampling_s"] + spent["reward_s"]


def serve_in_own_session(*args):
    """The sampler process's entry, first leaving the trainer's session (`--sampler-session`)."""
    os.setsid()
    from trajtune import async_sampler

    async_sampler._serve(*args)


class Clocked:
    """A loop `Run` that also notes when each step ended."""

    def __new__(cls, stage: str):
        from trajtune.loop import Run

        class _Clocked(Run):
            def end_step(self, *a, **k):
                super().end_step(*a, **k)
                self.times.append(time.perf_counter())

        r = _Clocked(stage)
        r.times = []
        return r


def per_step(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times[:-1], times[1:])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["agent", "hf"], choices=["agent", "hf"])
    ap.add_argument("--steps", type=int, default=16, help="RL steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per mode")
    ap.add_argument("--weak-steps", type=int, default=60, help="SFT steps of the agent workload's weak base")
    ap.add_argument("--sampler-session", action="store_true",
                    help="diagnostic for a shared machine with kernel.sched_autogroup_enabled=1 (one CPU share per "
                         "session): start the sampler process in its own session, so it gets a share of its own, "
                         "as it would get a core of its own on an idle machine")
    args = ap.parse_args()
    if args.sampler_session:
        from trajtune import async_sampler

        async_sampler._serve = serve_in_own_session
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    groups = autogroup.read_text().strip() if autogroup.exists() else "?"
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f} (1 min) "
          f"{load_before[1]:.2f} (5 min) at the start; sched_autogroup_enabled={groups}"
          f"{'; sampler in its own session' if args.sampler_session else ''}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for workload in args.workloads:
            if workload == "agent":
                weak = weak_base(args.weak_steps)
                go = lambda s, rep: agent_run(weak, s, args.steps)  # noqa: E731
            else:
                model = hf_files(d)
                go = lambda s, rep: hf_run(d, model, s, args.steps, d / f"grpo-{s}-{rep}")  # noqa: E731
            steps = {0: [], 1: []}
            walls = {0: [], 1: []}
            shares = []
            for rep in range(args.repeats):
                for staleness in (0, 1):
                    times, wall, collect_s = go(staleness, rep)
                    steps[staleness] += per_step(times)
                    walls[staleness].append(wall)
                    if staleness == 0:  # how much of a synchronous step is collecting (what can overlap)
                        shares.append(collect_s / args.steps / statistics.median(per_step(times)))
                    print(f"  {workload:<5} max_staleness {staleness}: {statistics.median(per_step(times)):.3f} s/step, "
                          f"run {wall:.1f} s", flush=True)
            sync, overlapped = statistics.median(steps[0]), statistics.median(steps[1])
            run0, run1 = statistics.median(walls[0]), statistics.median(walls[1])
            share = min(statistics.median(shares), 1.0)
            rows.append((workload, sync, overlapped, run0, run1, share))
    load_after = os.getloadavg()
    print(f"\nload average {load_after[0]:.2f} (1 min) {load_after[1]:.2f} (5 min) at the end; "
          f"{os.cpu_count()} CPUs")
    print("\n| workload | sync s/step | overlapped s/step | speed-up (s/step) | sync run s | overlapped run s | "
          "speed-up (run) | collect share of a sync step | bound 1/max(share, 1-share) |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for w, a, b, ra, rb, c in rows:
        print(f"| {w} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {ra:.1f} | {rb:.1f} | {ra / rb:.2f}x | {c:.0%} | "
              f"{1 / max(c, 1 - c):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
