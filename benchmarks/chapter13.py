"""Wall and CPU time of the seed-experiment recipes at full budget: chapter13 (part B), the
iw-SFT bandit (C1-C3) and, with --bugfix, iw-SFT on BugFix (C4).

Prints one row per stage (wall seconds, CPU seconds of the process that ran it) and, per
recipe, the total wall time and the CPU time of this process plus its worker processes.
Other jobs on the machine inflate wall times; CPU times are the comparable number.

    python benchmarks/chapter13.py                      # part B with 2 workers, then part C1-C3
    python benchmarks/chapter13.py --workers 1 --parts rlvr
    python benchmarks/chapter13.py --bugfix             # also C4
    python benchmarks/chapter13.py --skip-b --out runs/x  # part C only; stage rows of runs/x/chapter13 if present
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path


def cpu_seconds() -> float:
    """CPU (user + sys) of this process and its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(name: str, fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    fn()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    print(f"== {name}: {wall:.0f}s wall, {cpu:.0f}s CPU (this process + workers)", flush=True)
    return wall, cpu


def stage_rows(run_dir: Path) -> list[tuple[str, float, float]]:
    """(stage, wall s, CPU s) of every finished stage (trajtune.runs.stages: <stage>/results.json["time"])."""
    rows = []
    for f in sorted(run_dir.glob("*/results.json")):
        t = json.loads(f.read_text())["time"]
        rows.append((f.parent.name, t["wall_s"], t["cpu_s"]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts", nargs="+", default=["instruct", "preference", "rlvr"])
    ap.add_argument("--bugfix", action="store_true", help="also time C4 (iw-SFT on BugFix)")
    ap.add_argument("--skip-b", action="store_true", help="do not time part B (e.g. its stages were timed already)")
    ap.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-ch13-"))

    from trajtune.experiments import chapter13
    from trajtune.experiments.iw_sft import bandit as iw_sft_bandit, bugfix as iw_sft_bugfix
    from trajtune.runs.stages import StageOptions

    runner = StageOptions(workers=args.workers, threads=args.threads)
    totals = {}
    if not args.skip_b:
        b = chapter13.Config(parts=args.parts, runner=runner)
        totals["part B (chapter13)"] = timed("part B", lambda: chapter13.run(b, out / "chapter13"))
    c = iw_sft_bandit.Config(threads=args.threads)
    totals["part C1-C3 (iw_sft_bandit)"] = timed("part C1-C3", lambda: iw_sft_bandit.run(c, out / "iw_sft_bandit"))
    if args.bugfix:
        c4 = iw_sft_bugfix.Config(runner=runner)
        totals["part C4 (iw_sft_bugfix)"] = timed("part C4", lambda: iw_sft_bugfix.run(c4, out / "iw_sft_bugfix"))

    print(f"\n{'stage':<28} {'wall s':>7} {'CPU s':>7}")
    for recipe in ("chapter13", "iw_sft_bugfix"):
        for name, wall, cpu in stage_rows(out / recipe):
            print(f"{recipe + '/' + name:<28} {wall:7.0f} {cpu:7.0f}")
    for name, (wall, cpu) in totals.items():
        print(f"{'TOTAL ' + name:<28} {wall:7.0f} {cpu:7.0f}")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
