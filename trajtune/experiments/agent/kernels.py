"""The agent experiment's own `trajtune run` option, `--kernels`: with --seeds, the seeds again under each other CPU
kernel set (ATEN_CPU_CAPABILITY), another float path as on another CPU, in a child `trajtune run` per kernel set; the
seeds report then gives each claim's verdict on every (seed, kernel set).

    trajtune run agent --seeds 0,1,2 --kernels avx512,avx2   # this machine's kernel set first
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from ...config import ConfigError
from ...runs.stages import RunFailed

KERNEL_SETS = ("avx512", "avx2", "default")
"""ATen's CPU kernel sets on x86 (ATEN_CPU_CAPABILITY): each vectorises reductions its own way, so a run under
another one follows another float path, as on another CPU"""


def parse_options(argv: list[str], seeds: list[int] | None) -> argparse.Namespace:
    """The agent's own `trajtune run` options (`Experiment.parse_options`): `argv` parsed, --kernels checked against
    `seeds` and this machine -> Namespace(kernels=[...] or None)."""
    parser = argparse.ArgumentParser(prog="trajtune run agent", add_help=False, exit_on_error=False)
    parser.add_argument("--kernels", metavar="K,K,...", help="with --seeds: run the seeds again under each other CPU "
                        "kernel set (ATEN_CPU_CAPABILITY: avx512, avx2, default; this machine's first, e.g. "
                        "avx512,avx2): another float path, as on another CPU, into RUN_DIR/kernels-K/seed-S; the "
                        "report gives each claim's verdict on every (seed, kernel set)")
    try:
        options, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise ConfigError(f"experiment 'agent': {e}") from None
    if unknown:
        raise ConfigError(f"experiment 'agent' does not support {' '.join(unknown)} (its own options: --kernels)")
    options.kernels = parse_kernels(options.kernels, seeds) if options.kernels else None
    return options


def cpu_kernels(env: dict | None = None) -> str:
    """The CPU kernel set torch picks in a fresh process with `env` (default: this one's environment)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().lower()


def parse_kernels(text: str, seeds: list[int] | None) -> list[str]:
    """'avx512,avx2' -> ['avx512', 'avx2'] (for `--kernels`); the first is this machine's own (the seeds run here),
    each other one must be one torch can switch to here."""
    if not seeds:
        raise ConfigError("--kernels runs the --seeds again under each CPU kernel set; give --seeds too "
                          "(e.g. --seeds 0,1,2)")
    kernels = [x.strip().lower() for x in text.split(",") if x.strip()]
    if len(kernels) < 2 or len(set(kernels)) != len(kernels) or not set(kernels) <= set(KERNEL_SETS):
        raise ConfigError(f"--kernels: expected two or more distinct CPU kernel sets of {', '.join(KERNEL_SETS)} "
                          f"(this machine's first), like avx512,avx2; got {text!r}")
    here = cpu_kernels()
    if kernels[0] != here:
        raise ConfigError(f"--kernels: the first kernel set is this machine's own, {here} (the seeds run here first); "
                          f"got {kernels[0]!r}")
    for k in kernels[1:]:
        got = cpu_kernels({**os.environ, "ATEN_CPU_CAPABILITY": k})
        if got != k:
            raise ConfigError(f"--kernels: torch cannot run the {k} kernels on this machine (it picked {got})")
    return kernels


def run_under_kernels(kernels: str, recipe: Path, overrides: list[str], run_dir: Path,
                      seeds: list[int]) -> dict[int, Path]:
    """The same recipe, overrides and seeds in a child `trajtune run` under ATEN_CPU_CAPABILITY=`kernels` (set before
    torch loads; its stage processes inherit it), into run_dir -> {seed: its run directory}."""
    import subprocess

    argv = [sys.executable, "-m", "trajtune", "run", str(recipe), "--seeds", ",".join(map(str, seeds)),
            "--run-dir", str(run_dir)] + [x for s in overrides for x in ("--set", s)]
    print(f"trajtune: the seeds again under the {kernels} CPU kernels, in {run_dir}", flush=True)
    done = subprocess.run(argv, env={**os.environ, "ATEN_CPU_CAPABILITY": kernels})
    if done.returncode in (130, -signal.SIGINT):  # Ctrl-C reached the child too: it saved and said so
        raise KeyboardInterrupt(f"the run under the {kernels} CPU kernels in {run_dir} saved its stages")
    if done.returncode:
        raise RunFailed(f"the run under the {kernels} CPU kernels ({run_dir}) ended with exit code {done.returncode}")
    return {s: run_dir / f"seed-{s}" for s in seeds}
