"""The K-step pipeline (SamplingConfig.max_staleness = K, trajtune.sources.overlap) vs the synchronous loop: wall
time per step of the same RL run, for K in {1, 2, 4} against K = 0, with the bound each could reach.

    python benchmarks/async_rl.py                     # both workloads, K 1 2 4, 60 steps, 3 rotating repeats each
    python benchmarks/async_rl.py --quick             # a smoke run (8 steps, 1 repeat): checks it runs
    python benchmarks/async_rl.py --frozen            # equal work for every K (the weights do not move)
    python benchmarks/async_rl.py --workloads hf --hf-size small --staleness 1 2
    python benchmarks/async_rl.py --stale pace discard partial --tokens-per-update 16   # the policies side by side

Workloads:
  agent  the agent experiment's RL-only stage (its RLConfig and rl_optim: REINFORCE, 8 tasks x 8
         episodes of up to 6 turns on the BugFix gym, length buckets 4: multi-turn episodes of varying
         length) from a weak base SFT'd here on scripted blind + random play (`--weak-steps`), without
         the stage's evaluations
  hf     `trajtune grpo` (trajtune.experiments.hf.grpo.run) on a random tiny Llama (--hf-size small: the 3.0M
         one): 8 prompts x 8 completions of up to 8 new tokens (vs_trl.py's GRPO row; --hf-new-tokens), a
         reward function, the run's files and report

Stale work (`--stale pace discard partial`, sampling.stale; `--tokens-per-update` the virtual clock of discard and
partial): each K is run with each policy. pace samples step s with the weights after update max(0, s - K) and
throws nothing away; discard drops the groups the clock says arrive after their step trains (the step trains on
fewer episodes: compare the tokens column); partial continues the episodes in flight under the next update (its
episode loop runs in the trainer's background thread, sampling through the process in cuts).

All runs use tis_cap 2 (the overlapped loop needs it; on-policy it is a weight ~1). Threads: the
synchronous run on one torch thread (what the stage runner gives a stage); the overlapped runs with
the trainer on one thread and the sampler process on one (`sampler_threads`), i.e. one core each on
a 2-core machine. In an overlapped run the episodes (rendering, sampling, decoding, the
environments) run in the sampler process; the trainer process keeps the collect's bookkeeping and,
for hf, the batch reward call (its function runs in a reward worker process). Each repeat runs
K = 0 and every K once, the order rotated each repeat, so background load hits all alike; the load
average is printed at the start, before each run and at the end, with the machine and the commit.

s/step is the mean interval between the ends of consecutive steps after the first (the first holds
the start-up: the sampler process, the first K + 1 draws): the throughput, which is what a deeper
pipeline changes when step times vary (a median would hide it); "loop" is train_rl's wall, start-up
included. CPU seconds are counted per process (the trainer's `process_time`, the sampler's from
/proc): on a loaded machine (kernel.sched_autogroup_enabled=1 gives each session one share, however
many processes it runs) the wall ratios understate what two idle cores give, and "CPU critical
path" = sync CPU / max(trainer CPU, sampler CPU) is the speed-up an idle 2-core machine would give if
each process had a core (pipe latency left out).

The bounds come from the synchronous runs' own steps (2 .. n): c = the step's collect seconds (its
time/sampling_s + time/reward_s), u = the rest of its interval (the update and the bookkeeping).
"Perfect overlap" = sum(c + u) / max(sum c, sum u), what a pipeline of unbounded depth could give;
"pipeline K" = the synchronous s/step / that of an ideal K-step pipeline over the same c and u
(`pipeline_step_s`: no overhead, a core each, draw j released by the end of update j-K-1). With
constant step times K = 1 already reaches perfect overlap; the gap between "pipeline 1" and
"pipeline 4" is what K > 1 can buy from the variation of the step times, the "cv" column (standard
deviation / mean of c and u per step) says how much they vary.

A staler policy learns differently, so a learning run's work per step may change with K (on the agent
workload its episodes grow longer): the "tokens" column prints the policy tokens per episode of each
K, and `--frozen` (learning rate 1e-30: the float32 weights do not move) gives every K the same
episodes, timing the pipeline on equal work.
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
from typing import Callable

import torch

from trajtune.runs.hooks import Hook


def agent_run(weak_state: dict, staleness: int, steps: int, frozen: bool = False, stale: str = "pace",
              tokens_per_update: int = 0) -> tuple[list[float], float, float, list[dict]]:
    """The RL-only stage's loop from the weak base -> (step end times, loop seconds, whole-run seconds, the steps'
    metrics rows); the loop is the whole run here."""
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
    engine = make_engine(model, dataclasses.replace(c.rl_optim, lr=FROZEN_LR) if frozen else c.rl_optim)
    cfg = dataclasses.replace(c.rl, steps=steps, eval_every=0, tis_cap=2.0)
    sampling = SamplingConfig(max_staleness=staleness, stale=stale if staleness else "pace",
                              tokens_per_update=tokens_per_update if staleness and stale != "pace" else 0)
    source = gym.source(engine, sampling=sampling, rl=cfg)
    clock = StepClock()
    t0 = time.perf_counter()
    with source:
        rows = train_rl(engine, gym.train, source, cfg, gym.pad_id, run=Run("rl_only", hooks=[clock]))
    wall = time.perf_counter() - t0
    return clock.times, wall, wall, rows


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


def hf_run(d: Path, model: Path, staleness: int, steps: int, out: Path, new_tokens: int = 8, frozen: bool = False,
           stale: str = "pace", tokens_per_update: int = 0) -> tuple[list[float], float, float, list[dict]]:
    """`trajtune grpo` -> (step end times from metrics.jsonl, seconds of its RL loop (train_rl), seconds of the
    whole command, the steps' metrics rows)."""
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
                     sampling=SamplingConfig(max_new_tokens=new_tokens, max_staleness=staleness,
                                             stale=stale if staleness else "pace",
                                             tokens_per_update=tokens_per_update if staleness and stale != "pace"
                                             else 0),
                     optim=dataclasses.replace(hf_optim(), lr=FROZEN_LR) if frozen else hf_optim(),
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
    rows = [r for r in read_metrics(out) if r.get("stage") == "grpo"]
    return [r["time"] for r in rows], loop[0], wall, rows


FROZEN_LR = 1e-30
"""--frozen's learning rate: float32 weights do not move (an update smaller than their rounding), the update's
work is all done"""


def collect_s(row: dict) -> float:
    """A step's collect seconds from its metrics row: sampling and environments + reward functions (in an
    overlapped run: the background's, drawn ahead)."""
    return float(row.get("time/sampling_s", 0.0)) + float(row.get("time/reward_s", 0.0))


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


def pipeline_step_s(collect: list[float], update: list[float], k: int) -> float:
    """The s/step of a perfect K-step pipeline ("pace", trajtune.sources.overlap) over steps of these collect and
    update seconds, with no overhead and a core each for the trainer and the sampler process, measured as the
    runs are (the mean interval between step ends after the first): the draws run in order in the sampler; the
    draw of step j may start once step j-K's take has happened (the end of update j-K-1: it samples with the
    weights after update j-K), the first K+1 at once; update j starts when update j-1 has ended and draw j is
    in. K = 0 is the synchronous loop: the mean of c + u over steps 2.."""
    drawn: list[float] = []  # end of draw j
    ended: list[float] = []  # end of update j
    for j, (c, u) in enumerate(zip(collect, update)):
        release = (ended[j - k - 1] if j - k - 1 >= 0 else 0.0) if k else (ended[-1] if ended else 0.0)
        drawn.append(max(drawn[-1] if drawn else 0.0, release) + c)
        ended.append(max(ended[-1] if ended else 0.0, drawn[j]) + u)
    return (ended[-1] - ended[0]) / (len(ended) - 1)


def cv(xs: list[float]) -> float:
    """Coefficient of variation (standard deviation / mean) of a step time."""
    return statistics.pstdev(xs) / statistics.mean(xs) if len(xs) > 1 and statistics.mean(xs) > 0 else 0.0


def machine() -> str:
    """CPU model, thread count, torch and the commit (with '+changes' when tracked files differ from it)."""
    import platform
    import subprocess

    model = platform.processor() or "?"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        model = names[0] if names else model
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        commit += "+changes" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "? (not a git checkout)"
    return (f"{model}, {os.cpu_count()} CPU threads, torch {torch.__version__}, commit {commit}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def warm(run: Callable[[], object]) -> None:
    """Run once untimed, its output hidden (a short run would print as much as a timed one)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        run()


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min) {five:.2f} (5 min)"


@dataclasses.dataclass
class Result:
    """One run: K, its mean s/step after the first step, loop and run seconds, CPU seconds (trainer, sampler), the
    mean policy tokens per episode (the work: a staler policy may sample longer or shorter episodes), and
    (synchronous runs) each step's collect and update seconds, steps 2.. (the first holds the start-up)."""

    k: int
    step_s: float
    loop_s: float
    run_s: float
    cpu: tuple[float, float]
    tokens: float
    collect: list[float]
    update: list[float]
    dropped: float = 0.0  # the mean share of the sampled episodes discard threw away (staleness/discarded_share)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["agent", "hf"], choices=["agent", "hf"])
    ap.add_argument("--staleness", nargs="+", type=int, default=[1, 2, 4],
                    help="the K (max_staleness) of the overlapped runs, each against the synchronous run (K = 0)")
    ap.add_argument("--stale", nargs="+", default=["pace"], choices=["pace", "discard", "partial"],
                    help="the stale-work policies (sampling.stale) of the overlapped runs, each K with each")
    ap.add_argument("--tokens-per-update", type=int, default=16,
                    help="discard / partial's virtual clock: decode steps of the sampler per update")
    ap.add_argument("--steps", type=int, default=60, help="RL steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per K (and of the synchronous run)")
    ap.add_argument("--weak-steps", type=int, default=60, help="SFT steps of the agent workload's weak base")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 8 steps, 1 repeat, a 10-step weak base (numbers mean nothing)")
    ap.add_argument("--hf-size", default="tiny", choices=["tiny", "small"],
                    help="the hf workload's random Llama: tiny (0.10M parameters) or small (3.0M), vs_trl.py's sizes")
    ap.add_argument("--hf-new-tokens", type=int, default=8,
                    help="the hf workload's completion length (default 8, vs_trl.py's GRPO row). Longer completions "
                         "lengthen both sides, the update's forward and backward as well as the sampling: on the "
                         "small Llama collecting was 32%% of a synchronous step at 32 new tokens, as at 8")
    ap.add_argument("--frozen", action="store_true",
                    help=f"learning rate {FROZEN_LR}: the weights do not move, so every K samples the same episodes "
                         "and does the same work per step; isolates the pipeline from what staleness does to "
                         "learning (a staler policy learns differently: the agent's episodes grow longer)")
    ap.add_argument("--sampler-session", action="store_true",
                    help="diagnostic for a shared machine with kernel.sched_autogroup_enabled=1 (one CPU share per "
                         "session): start the sampler process in its own session, so it gets a share of its own, "
                         "as it would get a core of its own on an idle machine")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # here, not at import: tests import this module
    warnings.filterwarnings("ignore")
    if args.quick:
        args.steps, args.repeats, args.weak_steps = 8, 1, 10
    if args.steps < 3 or any(k < 1 for k in args.staleness):
        ap.error("--steps must be >= 3 and every --staleness K >= 1 (K = 0, the synchronous run, always runs)")
    ks: list[tuple[int, str]] = [(0, "sync"), *[(k, p) for k in sorted(set(args.staleness)) for p in args.stale]]
    if args.sampler_session:
        from trajtune.sources import process as async_sampler

        serve_in_own_session.serve, async_sampler._serve = async_sampler._serve, serve_in_own_session
    torch.set_num_threads(1)
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    groups = autogroup.read_text().strip() if autogroup.exists() else "?"
    load_start = load()
    print(f"{machine()}\nload average {load_start} at the start; sched_autogroup_enabled={groups}"
          f"{f'; --frozen (lr {FROZEN_LR})' if args.frozen else ''}"
          f"{'; sampler in its own session' if args.sampler_session else ''}", flush=True)
    results: dict[str, dict[tuple[int, str], list[Result]]] = {}
    sampler_cpu = SamplerCPU()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for workload in args.workloads:
            if workload == "agent":
                weak = weak_base(args.weak_steps)
                go = lambda v, rep, n=args.steps: agent_run(weak, v[0], n, args.frozen, v[1],  # noqa: E731
                                                            args.tokens_per_update)
            else:
                model = hf_files(d, args.hf_size)
                go = lambda v, rep, n=args.steps: hf_run(d, model, v[0], n,  # noqa: E731
                                                         d / f"grpo-{v[0]}-{v[1]}-{rep}", args.hf_new_tokens,
                                                         args.frozen, v[1], args.tokens_per_update)
            name = workload if workload == "agent" else f"hf ({args.hf_size})"
            results[name] = {k: [] for k in ks}
            for v in (ks[0], ks[-1]):  # untimed: the first run of a process pays one-off costs (imports, first calls)
                warm(lambda: go(v, "warm-up", 3))
            for rep in range(args.repeats):
                for v in ks[rep % len(ks):] + ks[:rep % len(ks)]:  # rotated each repeat: no K always first
                    k = v[0]
                    before, sampler_before, load_run = time.process_time(), sampler_cpu.seconds, os.getloadavg()[0]
                    times, loop, wall, rows = go(v, rep)
                    collect = [collect_s(row) for row in rows]
                    tokens = statistics.mean(float(row.get("rollout/policy_tokens", "nan")) for row in rows)
                    cpu = (time.process_time() - before, sampler_cpu.seconds - sampler_before)
                    gaps = per_step(times)
                    update = [g - c for g, c in zip(gaps, collect[1:])] if k == 0 else []
                    r = Result(k, statistics.mean(gaps), loop, wall, cpu, tokens, collect[1:] if k == 0 else [],
                               update, statistics.mean(row.get("staleness/discarded_share", 0.0) for row in rows))
                    results[name][v].append(r)
                    print(f"  {name:<10} K {k} {v[1]}: {r.step_s:.3f} s/step (median {statistics.median(gaps):.3f}), "
                          f"loop {loop:.1f} s, run {wall:.1f} s, CPU s trainer {cpu[0]:.1f} + sampler {cpu[1]:.1f}, "
                          f"{tokens:.1f} policy tokens / episode, "
                          f"load {load_run:.2f} at its start", flush=True)
    report(results, ks, args.steps, load_start)
    return 0


def report(results: dict[str, dict[tuple[int, str], list[Result]]], ks: list[tuple[int, str]], steps: int,
           load_start: str) -> None:
    """The table: per workload and K, medians over the repeats."""
    med = statistics.median
    print(f"\nload average {load_start} at the start, {load()} at the end")
    print(f"\n{steps} steps per run, medians over the repeats. s/step: the mean interval between the ends of "
          "consecutive steps after the first (the first holds the start-up). CPU critical path: sync CPU / max("
          "trainer CPU, sampler CPU), what an idle machine with a core per process would give. Bound: from the "
          "synchronous run's own steps 2.., c = collect (sampling, environments, rewards), u = the rest of the "
          "step (update, bookkeeping): perfect overlap = sum(c + u) / max(sum c, sum u); pipeline K = the s/step of "
          "the synchronous loop / that of an ideal K-step pipeline (pace: draw j starts after update j-K-1, update "
          "j after draw j; no overhead, a core each) over the same c and u, measured as the runs are. "
          "cv: each step's std / mean in the synchronous run. Tokens: mean policy tokens per episode (a staler policy "
          "learns differently, so the work per step may differ; sampled, discarded ones included). Dropped: the mean "
          "share of the sampled episodes discard threw away (their steps train on fewer).\n")
    print("| workload | K | stale | sync s/step | overlapped s/step | speed-up per step | speed-up loop | "
          "CPU s sync / trainer + sampler | CPU critical path | bound: pipeline K | bound: perfect overlap | "
          "collect share of a sync step | cv collect / update | tokens / episode sync / K | dropped |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, by_k in results.items():
        sync = by_k[ks[0]]
        s0, l0 = med([r.step_s for r in sync]), med([r.loop_s for r in sync])
        cpu0 = med([sum(r.cpu) for r in sync])
        c_total, u_total = [sum(r.collect) for r in sync], [sum(r.update) for r in sync]
        perfect = med([(c + u) / max(c, u) for c, u in zip(c_total, u_total)])
        share = med([c / (c + u) for c, u in zip(c_total, u_total)])
        cvs = f"{med([cv(r.collect) for r in sync]):.2f} / {med([cv(r.update) for r in sync]):.2f}"
        tok0 = med([r.tokens for r in sync])
        for v in ks[1:]:
            k, runs = v[0], by_k[v]
            s, lp = med([r.step_s for r in runs]), med([r.loop_s for r in runs])
            t, p = med([r.cpu[0] for r in runs]), med([r.cpu[1] for r in runs])
            pipe = med([pipeline_step_s(r.collect, r.update, 0) / pipeline_step_s(r.collect, r.update, k)
                        for r in sync])
            print(f"| {name} | {k} | {v[1]} | {s0:.3f} | {s:.3f} | {s0 / s:.2f}x | {l0 / lp:.2f}x | {cpu0:.1f} / "
                  f"{t:.1f} + "
                  f"{p:.1f} | {cpu0 / max(t, p, 1e-9):.2f}x | {pipe:.2f}x | {perfect:.2f}x | {share:.0%} | {cvs} | "
                  f"{tok0:.1f} / {med([r.tokens for r in runs]):.1f} | {med([r.dropped for r in runs]):.0%} |")


if __name__ == "__main__":
    sys.exit(main())
