"""Time the default agent comparison (recipes/agent.toml): wall and CPU seconds per stage,
and the share of each stage spent sampling (rollouts incl. environments) vs training.

    python benchmarks/agent.py                       # fresh run in a temporary directory
    python benchmarks/agent.py --workers 1           # everything in one process
    python benchmarks/agent.py --run-dir runs/bench  # keep the run (a second call reuses its stages)

The target (issue 5): the whole single-seed comparison in under 5 minutes on 2 CPU cores.
Wall time depends on what else the machine runs; CPU time (user + sys of the stage's
process) does not, so both are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import tempfile
import time
from pathlib import Path

from trajtune.cli import load_recipe, resolve_recipe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="agent", help="recipe name or file (default: agent)")
    ap.add_argument("--workers", type=int, default=None, help="override config.runner.workers")
    ap.add_argument("--run-dir", default=None, help="where to run (default: a temporary directory)")
    args = ap.parse_args()
    module, config, _ = load_recipe(resolve_recipe(args.recipe))
    if args.workers is not None:
        config = dataclasses.replace(config, runner=dataclasses.replace(config.runner, workers=args.workers))
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="agent-bench-"))
    t0 = time.perf_counter()
    before = _cpu()
    report = module.run(config, run_dir)
    wall, cpu = time.perf_counter() - t0, _cpu() - before
    results = module.stage_results(config, run_dir)  # read back: every stage's results.json exists now
    print(f"\n{'stage':<18} {'wall s':>7} {'CPU s':>7} {'sampling':>9} {'training':>9}")
    sampling = training = 0.0
    for name, r in results.items():
        t = r["time"]
        sampled = t.get("sampling_s", 0.0)
        share = sampled / max(t["wall_s"], 1e-9)
        sampling, training = sampling + sampled, training + t["wall_s"] - sampled
        print(f"{name:<18} {t['wall_s']:>7.1f} {t['cpu_s']:>7.1f} {share:>9.0%} {1 - share:>9.0%}")
    print(f"{'sum of stages':<18} {sampling + training:>7.1f} {'':>7} {sampling / (sampling + training):>9.0%} "
          f"{training / (sampling + training):>9.0%}")
    print(f"\nwhole run: {wall:.1f}s wall, {cpu:.1f}s CPU (user+sys, all processes), "
          f"{config.runner.workers} worker(s), "
          f"{os.cpu_count()} CPUs; target < 300s wall")
    print(report)


def _cpu() -> float:
    """User + sys seconds of this process and its finished children (the stage workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


if __name__ == "__main__":
    main()
