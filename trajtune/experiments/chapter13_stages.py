"""Run an experiment's stages, in dependency order, in one process or a small pool of processes.

A stage is a module-level function `fn(config, run_dir, *args) -> dict` that reads its
inputs from files earlier stages wrote into `run_dir` and returns JSON-able results.
`run_stages` runs each stage once: a finished stage leaves `<run_dir>/<name>/result.json`
and is skipped when the run is resumed; a stage cut short by Ctrl-C / SIGTERM left
`<run_dir>/<name>/resume` (its loop's checkpoint) and continues from there. With `workers > 1` independent stages run in
parallel processes (spawned, `threads` torch threads each): tiny models on a few cores
go faster as several single-threaded processes than as one multi-threaded one.
Every stage's results carry its wall and CPU seconds (`_wall_s`, `_cpu_s`).
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..resume import StageClock, forward_to_children


@dataclass
class Stage:
    name: str
    """directory name under the run directory; also the key of its results"""
    fn: Callable[..., dict]
    """module-level function fn(config, run_dir, *args) -> dict (picklable for worker processes)"""
    args: tuple = ()
    """extra positional arguments after (config, run_dir)"""
    after: tuple[str, ...] = field(default_factory=tuple)
    """stages that must finish first"""


def _call(stage: Stage, config, run_dir: str, threads: int) -> dict:
    torch.set_num_threads(threads)
    out = Path(run_dir) / stage.name
    clock = StageClock(out / "resume")  # times add up over a stage cut short and resumed
    try:
        result = stage.fn(config, Path(run_dir), *stage.args)
    except KeyboardInterrupt:
        clock.save()
        raise
    t = clock.totals()
    result.update(_wall_s=t["wall_s"], _cpu_s=t["cpu_s"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    shutil.rmtree(out / "resume", ignore_errors=True)  # finished: a forced rerun starts afresh
    return result


def run_stages(stages: list[Stage], config, run_dir: Path, workers: int = 1, threads: int = 1,
               log: Callable[[str], None] = print) -> dict[str, dict]:
    """Run `stages` (listed in priority order) and return {name: results}."""
    names = {s.name for s in stages}
    for s in stages:
        missing = set(s.after) - names
        if missing:
            raise ValueError(f"stage {s.name!r} waits for unknown stages {sorted(missing)}")
    results: dict[str, dict] = {}
    for s in stages:  # resume: finished stages are read back
        done = Path(run_dir) / s.name / "result.json"
        if done.exists():
            results[s.name] = json.loads(done.read_text())
    pending = [s for s in stages if s.name not in results]

    def ready() -> list[Stage]:
        return [s for s in pending if all(a in results for a in s.after)]

    if workers <= 1:
        previous = torch.get_num_threads()
        try:
            while pending:
                s = ready()[0] if ready() else None
                if s is None:
                    raise ValueError(f"stages wait on each other: {[p.name for p in pending]}")
                pending.remove(s)
                results[s.name] = _call(s, config, str(run_dir), threads)
                log(f"  {s.name}: {results[s.name]['_wall_s']:.0f}s")
        finally:
            torch.set_num_threads(previous)
        return results

    with forward_to_children(), ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        running = {}
        while pending or running:
            for s in ready()[: workers - len(running)]:
                pending.remove(s)
                running[pool.submit(_call, s, config, str(run_dir), threads)] = s
            if not running:
                raise ValueError(f"stages wait on each other: {[p.name for p in pending]}")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                s = running.pop(f)
                results[s.name] = f.result()
                log(f"  {s.name}: {results[s.name]['_wall_s']:.0f}s")
    return results
