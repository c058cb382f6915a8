"""Overlapped RL (SamplingConfig.max_staleness = 1, trajtune.sources.overlap) vs the synchronous loop: wall time of the
same RL run.

    python benchmarks/async_rl.py                     # both workloads, 60 steps, 2 alternating repeats each
    python benchmarks/async_rl.py --workloads agent --steps 16 --repeats 1

Workloads:
  agent  the agent experiment's RL-only stage (its RLConfig and rl_optim: REINFORCE, 8 tasks x 8
         episodes of up to 6 turns on the BugFix gym, length buckets 4) from a weak base SFT'd here on
         scripted blind + random play (`--weak-steps`), without the stage's evaluations
  hf     `trajtune grpo` (trajtune.experiments.hf.grpo.run) on a random tiny Llama (--hf-size small: the 3.0M
         one): 8 prompts x 8
         completions of up to 8 new tokens (vs_trl.py's GRPO row; --hf-new-tokens), a reward function, the run's
         files and report

Both loops run with tis_cap 2 (the overlapped loop needs it; on-policy it is a weight ~1). Threads:
the synchronous run on one torch thread (what the stage runner gives a stage); the overlapped run
with the trainer on one thread and the sampler process on one (`sampler_threads`), i.e. one core
each on a 2-core machine. In the overlapped run the episodes (rendering, sampling, decoding, the
environments) run in the sampler process; the trainer process keeps the collect's bookkeeping
and, for hf, the batch reward call (its function runs in a reward worker process). Runs alternate
(sync, async, sync, async ...) so background load hits both alike; the load average is printed
before and after. s/step is the median interval between consecutive logged steps after the first
(the first step holds the start-up: the sampler process, the first batch); "loop" is train_rl's
wall, start-up included; "run" the whole call (for hf: loading the model and data, writing the
model and report too, the same in both modes), so the whole-run ratios approach the per-step one
as runs get longer (60 steps by default). CPU seconds are counted per process (the trainer's
`process_time`, the sampler's from /proc): on a loaded machine (kernel.sched_autogroup_enabled=1
gives each session one share, however many processes it runs) the wall ratios understate what
two idle cores give, and "CPU critical path" = sync CPU / max(trainer CPU, sampler CPU) is the
speed-up an idle 2-core machine would give if each process had a core (pipe latency left out).
The last columns say how much of a synchronous step is collecting (sampling, environments,
rewards) and the speed-up that perfect overlap of collecting and training would give.
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

from trajtune.runs.hooks import Hook  # noqa: E402


def agent_run(weak_state: dict, staleness: int, steps: int) -> tuple[list[float], float, float, float]:
    """The RL-only stage's loop from the weak base -> (step end times, loop seconds, whole-run seconds, collect
    seconds); the loop is the whole run here."""
    from trajtune.algorithms.rl import train_rl
    from trajtune.engine import make_engine
    from trajtune.experiments.agent import Config as AgentConfig
    from trajtune.experiments.bugfix import Gym, new_model

    from trajtune.runs.loop import Run
    from trajtune.sources.sampling import SamplingConfig

    c = AgentConfig()
    gym = Gym(c.max_turns, c.max_action_tokens)
    model = new_model(c.seed, gym, c.dim, c.n_layers, c.n_heads)
    model.load_state_dict(weak_state)
    engine = make_engine(model, c.rl_optim)
    cfg = dataclasses.replace(c.rl, steps=steps, eval_every=0, tis_cap=2.0)
    source = gym.source(engine, sampling=SamplingConfig(max_staleness=staleness), rl=cfg)
    clock = StepClock()
    t0 = time.perf_counter()
    with source:
        rows = train_rl(engine, gym.train, source, cfg, gym.pad_id, run=Run("rl_only", hooks=[clock]))
    wall = time.perf_counter() - t0
    return clock.times, wall, wall, sum(r["time/sampling_s"] for r in rows)


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


def hf_files(d: Path, size: str = "tiny") -> Path:
    from trajtune.models.hf_random import make_random_model

    model = make_random_model(d / f"model-{size}", "llama", size)
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(64):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i} + 5?"}],
                                "answer": str(i + 5)}) + "\n")
    (d / "rewards.py").write_text("def has_answer(prompts, completions, answer, **kw):\n"
                                  "    return [float(a in c[-1]['content']) for c, a in zip(completions, answer)]\n")
    return model


def hf_run(d: Path, model: Path, staleness: int, steps: int, out: Path,
           new_tokens: int = 8) -> tuple[list[float], float, float, float]:
    """`trajtune grpo` -> (step end times from metrics.jsonl, seconds of its RL loop (train_rl), seconds of the
    whole command, collect seconds: sampling + rewards)."""
    from trajtune.experiments.hf import grpo
    from trajtune.algorithms.rl import RLConfig
    from trajtune.experiments.hf.common import OutputConfig, hf_optim
    from trajtune.experiments.hf.grpo import GRPORun, run
    from trajtune.experiments.hf.model import ModelConfig
    from trajtune.sources.sampling import SamplingConfig
    from trajtune.metrics import read_metrics

    config = GRPORun(model=ModelConfig(path=str(model)), data=str(d / "prompts.jsonl"),
                     reward=[f"{d / 'rewards.py'}:has_answer"],
                     rl=RLConfig(steps=steps, tasks_per_step=8, group_size=8, advantage="grpo", aggregation="sequence",
                                 tis_cap=2.0),
                     sampling=SamplingConfig(max_new_tokens=new_tokens, max_staleness=staleness), optim=hf_optim(),
                     output=OutputConfig(logging_steps=0))
    loop, train_rl = [], grpo.train_rl

    def timed_train_rl(*a, **k):  # the stage runs in this process (one stage)
        t = time.perf_counter()
        try:
            return train_rl(*a, **k)
        finally:
            loop.append(time.perf_counter() - t)

    grpo.train_rl = timed_train_rl
    t0 = time.perf_counter()
    try:
        run(config, out)
    finally:
        grpo.train_rl = train_rl
    wall = time.perf_counter() - t0
    spent = json.loads((out / "grpo" / "results.json").read_text())["time"]
    return ([r["time"] for r in read_metrics(out) if r.get("stage") == "grpo"], loop[0], wall,
            spent["sampling_s"] + spent["reward_s"])


class SamplerCPU:
    """CPU seconds of the sampler processes, read from /proc as each closes (Linux; 0 elsewhere)."""

    def __init__(self):
        from trajtune.sources.process import SamplerProcess

        self.seconds, close = 0.0, SamplerProcess.close
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

        def counted(sp):
            pid = sp._process.pid if sp._process is not None else None
            stat = Path(f"/proc/{pid}/stat")
            if not sp._closed and pid and stat.exists():
                fields = stat.read_text().rsplit(")", 1)[1].split()
                self.seconds += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
            close(sp)

        SamplerProcess.close = counted


def serve_in_own_session(*args):
    """The sampler process's entry, first leaving the trainer's session (`--sampler-session`)."""
    os.setsid()
    from trajtune.sources import process as async_sampler

    # a fork inherits the patched module (main() keeps the real entry here); a fork server's child imports it afresh
    (getattr(serve_in_own_session, "serve", None) or async_sampler._serve)(*args)


class StepClock(Hook):
    """A run's hook that notes when each step ended (its save point)."""

    def __init__(self):
        self.times: list[float] = []

    def on_save_point(self, engine, completed: int, allowed: bool) -> None:
        self.times.append(time.perf_counter())


def per_step(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times[:-1], times[1:])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["agent", "hf"], choices=["agent", "hf"])
    ap.add_argument("--steps", type=int, default=60, help="RL steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per mode")
    ap.add_argument("--weak-steps", type=int, default=60, help="SFT steps of the agent workload's weak base")
    ap.add_argument("--hf-size", default="tiny", choices=["tiny", "small"],
                    help="the hf workload's random Llama: tiny (0.10M parameters) or small (3.0M), vs_trl.py's sizes")
    ap.add_argument("--hf-new-tokens", type=int, default=8,
                    help="the hf workload's completion length (default 8, vs_trl.py's GRPO row). Longer completions "
                         "lengthen both sides, the update's forward and backward as well as the sampling: on the "
                         "small Llama collecting was 32%% of a synchronous step at 32 new tokens, as at 8")
    ap.add_argument("--sampler-session", action="store_true",
                    help="diagnostic for a shared machine with kernel.sched_autogroup_enabled=1 (one CPU share per "
                         "session): start the sampler process in its own session, so it gets a share of its own, "
                         "as it would get a core of its own on an idle machine")
    args = ap.parse_args()
    if args.sampler_session:
        from trajtune.sources import process as async_sampler

        serve_in_own_session.serve, async_sampler._serve = async_sampler._serve, serve_in_own_session
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    groups = autogroup.read_text().strip() if autogroup.exists() else "?"
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f} (1 min) "
          f"{load_before[1]:.2f} (5 min) at the start; sched_autogroup_enabled={groups}"
          f"{'; sampler in its own session' if args.sampler_session else ''}", flush=True)
    rows, sampler_cpu = [], SamplerCPU()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for workload in args.workloads:
            if workload == "agent":
                weak = weak_base(args.weak_steps)
                go = lambda s, rep: agent_run(weak, s, args.steps)  # noqa: E731
            else:
                model = hf_files(d, args.hf_size)
                # noqa: E731
                go = lambda s, rep: hf_run(d, model, s, args.steps, d / f"grpo-{s}-{rep}", args.hf_new_tokens)
            steps, loops, walls, cpus = ({0: [], 1: []} for _ in range(4))
            shares = []
            for rep in range(args.repeats):
                for staleness in (0, 1):
                    before, sampler_before = time.process_time(), sampler_cpu.seconds
                    times, loop, wall, collect_s = go(staleness, rep)
                    cpu = (time.process_time() - before, sampler_cpu.seconds - sampler_before)
                    steps[staleness] += per_step(times)
                    loops[staleness].append(loop)
                    walls[staleness].append(wall)
                    cpus[staleness].append(cpu)
                    if staleness == 0:  # how much of a synchronous step is collecting (what can overlap)
                        shares.append(collect_s / args.steps / statistics.median(per_step(times)))
                    print(f"  {workload:<5} max_staleness {staleness}: {statistics.median(per_step(times)):.3f} "
                          "s/step, "
                          f"loop {loop:.1f} s, run {wall:.1f} s, CPU s trainer {cpu[0]:.1f} + sampler {cpu[1]:.1f}",
                          flush=True)
            med = lambda xs: statistics.median(xs)  # noqa: E731
            cpu0 = med([a + b for a, b in cpus[0]])
            trainer1, sampler1 = med([a for a, _ in cpus[1]]), med([b for _, b in cpus[1]])
            rows.append((workload, med(steps[0]), med(steps[1]), med(loops[0]), med(loops[1]), med(walls[0]),
                         med(walls[1]), cpu0, trainer1, sampler1, min(med(shares), 1.0)))
    load_after = os.getloadavg()
    print(f"\nload average {load_after[0]:.2f} (1 min) {load_after[1]:.2f} (5 min) at the end; "
          f"{os.cpu_count()} CPUs")
    print(f"\n{args.steps} steps per run; per step: median s/step; loop: train_rl's wall (the sampler's start-up "
          "and first step included); run: the whole command (hf: model and data loading, model and report "
          "saving too); CPU s: sync = its one process, overlapped = trainer + sampler process; the last-but-two "
          "column is what an idle 2-core machine would give if each process had a core: sync CPU / max(trainer "
          "CPU, sampler CPU)\n")
    print("| workload | sync s/step | overlapped s/step | speed-up per step | sync loop s | overlapped loop s | "
          "speed-up loop | sync run s | overlapped run s | speed-up run | CPU s sync | CPU s trainer + sampler | "
          "CPU critical path speed-up | collect share of a sync step | bound 1/max(share, 1-share) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w, a, b, la, lb, ra, rb, c0, t1, s1, c in rows:
        print(f"| {w} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {la:.1f} | {lb:.1f} | {la / lb:.2f}x | {ra:.1f} | "
              f"{rb:.1f} | {ra / rb:.2f}x | {c0:.1f} | {t1:.1f} + {s1:.1f} | {c0 / max(t1, s1):.2f}x | {c:.0%} | "
              f"{1 / max(c, 1 - c):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
