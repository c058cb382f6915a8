"""The run directory: one owner for its name, its lock, its config.json and what a run does when it
finds an earlier one there (STYLE 12, tinker-cookbook's `check_log_dir(log_dir, behavior_if_exists)`:
one policy, every entry point).

    RunDir.fresh("agent")     runs/agent-<YYYYmmdd-HHMMSS>[-n], made at once (rank 0's choice on every rank)
    rundir.hold()             the lock for a whole run (`run_lock`); a fresh directory that a failed run
                              left empty is removed
    rundir.check(config)      -> Plan: what a run of `config` does here, or a ConfigError saying why not
                              (the changed keys, the stages they change, the option to pass); reads only
    rundir.begin(config)      check, then make it so (rank 0): --overwrite's clearing, the results of the
                              stages to run again forgotten, config.json written atomically
    run_seeds(run, config, run_dir, seeds)   one run per seed in run_dir/seed-<s>, each a RunDir

Who calls it: `trajtune run` (`cli.cmd_run`: names and holds the directory, checks every seed's before the
first runs, --dry-run), the Hugging Face commands (`cli.hf.cmd_hf`: the same with their own policy for a
finished run, and --overwrite), `experiments.hf.recipe.run_method` (checks before the data, begins after
it), and the stage runner (`run_stages` begins every staged run, knowing its stages).

What a run finds, and does:

    found                               trajtune run (and run_stages)        trajtune sft|rm|dpo|grpo|rft
    nothing, or no stage yet            runs; config.json written            runs; config.json written
    same config, stages unfinished      finished stages read back, a stage cut short resumes from its checkpoint
    same config, every stage finished   read back, the report written again  refused, unless --overwrite
    changed config                      refused, naming the changed keys     finished: refused unless --overwrite;
                                        (old -> new), the finished stages    cut short: resumes if only the
                                        they change and the option to pass;  config's RESUMABLE keys changed,
                                        runs if no finished stage read them  else refused naming the keys
    ... and those stages in             they run again (their results and    --
        runner.rerun                    resume state forgotten first);
                                        config.json rewritten
    a directory in use                  refused, naming the holder (pid, host, command, since)
    --overwrite                         --                                   after the checks pass, the earlier
                                                                             run's outputs removed; from step 0
    --dry-run                           the same checks and the experiment's `dry_run` hook; nothing written

Which stages a change affects is recorded, not guessed: a finished stage's results.json holds "inputs",
the top-level config fields its function reads (declared, `stages.Stage.reads`) and the stages
it waited for (`Stage.after`). A finished stage is affected iff it read a changed field, or waited
(transitively) on an affected stage; one without a record (directories of older versions) by any change;
a stage cut short (a checkpoint, no results) by any change but its config's `RESUMABLE` keys. Fields a
config section lists in its `NO_EFFECT` never count (`StageOptions`: workers, rerun, checkpoint_every,
log_every; the HF `OutputConfig`: logging_steps, report_to, save_total_limit). Nothing a refused run
meets is deleted or rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence

from ..checkpoint import write_json
from ..config import ConfigError, flatten, to_dict
from ..engine import distributed
from .lock import LOCK, RunDirBusy, holder, run_lock  # noqa: F401 (run_lock: the lock is part of RunDir's API)

RUNS = Path("runs")
"""where a run without a named directory gets its fresh one, runs/<name>-<YYYYmmdd-HHMMSS>"""
CONFIG = "config.json"
RESULTS = "results.json"
"""run_dir/<stage>/results.json: the stage finished (what its function returned, "time", "inputs")"""
INPUTS = "inputs"
"""the results' record of what the stage reads: {"config": [top-level fields] or None, "stages": [its after]}"""
LOCKS = (LOCK, ".metrics.lock")
"""what a run holds in its directory while it lives (a directory holding only these is unused)"""


@dataclass
class StageOnDisk:
    """A stage directory an earlier run left: finished (results.json) or cut short (a checkpoint)."""

    name: str
    finished: bool
    reads: frozenset[str] | None = None
    """the top-level config fields it read (None: no record)"""
    after: tuple[str, ...] = ()
    """the stages it waited for (from its record)"""
    results: dict = field(default_factory=dict)


@dataclass
class Plan:
    """What a run will do in its directory (`RunDir.check`), in words by `describe`."""

    path: Path
    finished: list[str] = field(default_factory=list)
    """stages finished there, read back (minus `rerun`)"""
    cut_short: list[str] = field(default_factory=list)
    """stages with a checkpoint to resume from"""
    changed: dict[str, tuple] = field(default_factory=dict)
    """config key -> (saved, now), keys that can change results"""
    rerun: list[str] = field(default_factory=list)
    """stages the change affects, run again: their results and resume state are forgotten at `begin`"""
    clear: bool = False
    """--overwrite: what the earlier run wrote is removed at `begin`"""
    write_config: bool = False
    """config.json is missing or differs (in any key): written at `begin`"""

    def describe(self) -> str:
        """One line: what a run would do here."""
        if self.clear:
            return f"{self.path}: --overwrite: the earlier run's outputs are removed and it trains from step 0"
        parts = []
        if self.changed:
            parts.append(f"the config changed ({_diff(self.changed)})" + (
                f": {', '.join(self.rerun)} run again" if self.rerun else ": nothing read back depends on it"))
        elif self.rerun:
            parts.append(f"run again, as runner.rerun asks: {', '.join(self.rerun)}")
        kept = [s for s in self.finished if s not in self.rerun]
        if kept:
            parts.append(f"finished stages read back: {', '.join(kept)}")
        resumed = [s for s in self.cut_short if s not in self.rerun]
        if resumed:
            parts.append(f"resumed from a checkpoint: {', '.join(resumed)}")
        return f"{self.path}: " + ("; ".join(parts) if parts else "a new run")


@dataclass
class RunDir:
    """A run directory and the policy for what an earlier run there means (the module's table)."""

    path: Path
    if_finished: Literal["reuse", "refuse"] = "reuse"
    """a finished stage there: read back (`trajtune run`) or the run refused (the HF commands)"""
    overwrite: bool | None = None
    """--overwrite given (True), not given (False); None: the command has no such option"""
    outputs: tuple[str, ...] = ()
    """what --overwrite removes besides config.json, metrics.jsonl and the stage directories (names, globs)"""
    command: str = "run"
    """the trajtune command (its messages: 'trajtune sft: ...', 'a finished sft run')"""
    option: str = "--run-dir"
    """how the command names the directory"""
    spell: Callable[[str], str] | None = None
    """how the command names a config key (the HF commands: its flag, rl.kl_coef -> --kl-coef)"""
    created: bool = False
    """made by `fresh` for this run (removed again if the run fails leaving nothing in it)"""

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def fresh(cls, name: str, create: bool = True, root: str | os.PathLike = RUNS, **policy) -> RunDir:
        """runs/<name>-<YYYYmmdd-HHMMSS>, or with -2, -3 ... where that exists; made at once (rank 0's
        choice on every rank), so two runs started in the same second get two directories. `create=False`
        (--dry-run): the name a run would get, nothing made."""
        path, error = None, None
        if distributed.is_main():
            base = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
            for n in range(1, 10_000):
                path = base if n == 1 else base.with_name(f"{base.name}-{n}")
                if not create:
                    if not path.exists():
                        break
                    continue
                try:
                    path.mkdir(parents=True)
                    break
                except FileExistsError:
                    continue
                except OSError as e:
                    error = (f"cannot create a run directory in {root}: {e.strerror or e}; "
                             f"choose one with {policy.get('option', '--run-dir')}")
                    break
        path, error = distributed.broadcast_object((str(path), error))
        if error:
            raise ConfigError(error)
        return cls(Path(path), created=create, **policy)

    @property
    def label(self) -> str:
        return "trajtune" if self.command == "run" else f"trajtune {self.command}"

    # --- the lock ---------------------------------------------------------------------------
    def lock(self):
        """`run_lock(self.path)`: one run per directory."""
        return run_lock(self.path)

    @contextlib.contextmanager
    def hold(self) -> Iterator[RunDir]:
        """The lock for a whole run; a fresh directory the run leaves unused (it failed before writing
        anything) is removed, so a refused run leaves no empty directory behind."""
        try:
            with run_lock(self.path):
                yield self
        except BaseException:
            if self.created and distributed.is_main():
                self.remove_if_unused()
            raise

    def remove_if_unused(self) -> None:
        """Remove the directory if nothing but the locks is in it."""
        if self.path.is_dir() and all(p.name in LOCKS for p in self.path.iterdir()):
            shutil.rmtree(self.path, ignore_errors=True)

    def check_free(self) -> None:
        """`RunDirBusy` if another process holds the directory now (for --dry-run: takes nothing, writes
        nothing; rank 0 looks, every rank hears)."""
        busy = distributed.broadcast_object(holder(self.path) if distributed.is_main() else None)
        if busy is not None:
            raise RunDirBusy(busy)

    # --- the policy -------------------------------------------------------------------------
    def check(self, config: Any, stages: Sequence[str] | None = None, rerun: Iterable[str] | None = None) -> Plan:
        """What a run of `config` does here (the module's table), or a ConfigError saying why it may not.
        Reads only. `stages`: the names of the run's stages where known (`run_stages`): stages of an earlier
        config left in the directory are then not part of this run; unknown (the command line before the
        run starts), every stage there counts. `rerun`: the stages the user asks to run again (default
        `config.runner.rerun`). Rank 0 decides; every rank gets its answer."""
        answer = None
        if distributed.is_main():
            try:
                answer = self._check(config, stages, rerun)
            except ConfigError as e:
                answer = ConfigError(str(e))
            except OSError as e:  # e.g. a directory this user may not list
                answer = ConfigError(f"cannot read the run directory {self.path}: {e.strerror or e}"
                                     f"{f' ({e.filename})' if e.filename else ''}")
        answer = distributed.broadcast_object(answer)
        if isinstance(answer, ConfigError):
            raise answer
        return answer

    def begin(self, config: Any, stages: Sequence[str] | None = None, rerun: Iterable[str] | None = None) -> Plan:
        """`check`, then make it so (rank 0; every rank waits): clear for --overwrite, forget the results and
        resume state of the stages to run again, write config.json atomically. Call it holding the lock."""
        plan = self.check(config, stages, rerun)
        if distributed.is_main():
            if plan.clear:
                gone = self.clear()
                if gone:
                    print(f"{self.label}: --overwrite: removed the earlier run's {', '.join(gone)} in {self.path}",
                          flush=True)
            for name in plan.rerun:
                (self.path / name / RESULTS).unlink(missing_ok=True)
                shutil.rmtree(self.path / name / "resume", ignore_errors=True)
            if plan.changed:
                print(f"{self.label}: {self.path}: the config changed ({_diff(plan.changed, self.spell)}); "
                      + (f"running {', '.join(plan.rerun)} again" if plan.rerun else "nothing read back depends on it"),
                      flush=True)
            if plan.write_config:
                write_json(self.path / CONFIG, to_dict(config))
        distributed.barrier()
        return plan

    def clear(self) -> list[str]:
        """Remove what a run wrote here (config.json, metrics.jsonl, every stage directory, `outputs`); the
        locks stay. Returns the names removed."""
        if not self.path.is_dir():
            return []
        found = [self.path / CONFIG, self.path / "metrics.jsonl", *(self.path / s for s in stages_on_disk(self.path))]
        for pattern in self.outputs:
            found += sorted(self.path.glob(pattern))
        gone = []
        for p in dict.fromkeys(found):
            if p.name in LOCKS:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
                gone.append(p.name + "/")
            elif p.exists() or p.is_symlink():
                p.unlink()
                gone.append(p.name)
        return gone

    def _check(self, config: Any, stages: Sequence[str] | None, rerun: Iterable[str] | None) -> Plan:
        p = self.path
        if p.exists() and not p.is_dir():
            raise ConfigError(f"the run directory {p} is a file, not a directory; choose another one")
        on_disk = stages_on_disk(p) if p.is_dir() else {}
        if stages is not None:
            on_disk = {n: s for n, s in on_disk.items() if n in stages}
        plan = Plan(p, [n for n, s in on_disk.items() if s.finished], [n for n, s in on_disk.items() if not s.finished])
        if self.overwrite:
            plan.clear, plan.write_config = True, config is not None
            return plan
        if self.if_finished == "refuse" and plan.finished:
            raise ConfigError(self._finished_message(on_disk[plan.finished[0]]))
        if config is None:  # nothing to compare (the runner's own tests)
            return plan
        now = flatten(json.loads(json.dumps(to_dict(config))))
        saved_file = p / CONFIG
        try:
            saved = flatten(json.loads(saved_file.read_text()))
        except (OSError, ValueError, AttributeError):
            if on_disk:
                what = "a finished run" if plan.finished else "a checkpoint of a run"
                raise ConfigError(f"{p} holds {what} ({', '.join(on_disk)}) but no readable {CONFIG} to compare this "
                                  f"config with; {self._remedy(on_disk, config)}") from None
            plan.write_config = True
            return plan
        added = _defaults(config)  # a key the saved config lacks at its default: added by a later trajtune, no change
        differ = [k for k in dict.fromkeys([*saved, *now]) if not _same(saved.get(k, _MISSING), now.get(k, _MISSING))
                  and not (k not in saved and k in added and _same(added[k], now.get(k, _MISSING)))]
        plan.write_config = bool(differ)
        quiet = no_effect(config)
        plan.changed = {k: (saved.get(k), now.get(k)) for k in differ if k not in quiet}
        asked = list(rerun if rerun is not None else getattr(getattr(config, "runner", None), "rerun", ()) or ())
        if not plan.changed:
            # asked for by name: a finished one runs again; one cut short (a rerun interrupted) resumes
            plan.rerun = [name for name, stage in on_disk.items() if name in asked and stage.finished]
            return plan
        affected = self._affected(plan.changed, on_disk, set(getattr(type(config), "RESUMABLE", ())))
        if any(s not in asked for s in affected):
            raise ConfigError(self._changed_message(plan.changed, affected, asked, config))
        plan.rerun = list(affected)
        return plan

    @staticmethod
    def _affected(changed: dict, on_disk: dict[str, StageOnDisk], resumable: set[str]) -> dict[str, str]:
        """stage -> why the change affects it, in dependency order (see the module docstring)."""
        why = {}
        for name, s in on_disk.items():
            if not s.finished:
                hit = [k for k in changed if k not in resumable]
                if hit:
                    why[name] = "cut short: its checkpoint is of the saved config"
            elif s.reads is None:
                why[name] = "no record of what it read"
            else:
                read = sorted({k.split(".")[0] for k in changed} & s.reads)
                if read:
                    why[name] = f"it read {', '.join(read)}"
        grew = True
        while grew:  # every stage downstream of an affected one
            grew = False
            for name, s in on_disk.items():
                upstream = [a for a in s.after if a in why]
                if name not in why and upstream:
                    why[name], grew = f"after {', '.join(upstream)}", True
        return {n: why[n] for n in _ordered(on_disk) if n in why}

    def _changed_message(self, changed: dict, affected: dict[str, str], asked: list[str], config: Any) -> str:
        stages = ", ".join(f"{n} ({why})" for n, why in affected.items())
        return (f"{self.path} holds a run of another config ({_diff(changed, self.spell)}), which changes "
                f"stages it holds: {stages}; {self._remedy(affected, config, asked)} (nothing in {self.path} "
                "was changed)")

    def _remedy(self, affected: Iterable[str], config: Any, asked: Sequence[str] = ()) -> str:
        """What the user can do about stages that cannot be read back: the option to pass."""
        names = list(dict.fromkeys([*asked, *affected]))
        if hasattr(getattr(config, "runner", None), "rerun"):
            listed = ",".join(f'"{n}"' for n in names)
            first = f"to run them again with this config pass --set 'config.runner.rerun=[{listed}]'"
        elif self.overwrite is not None:
            first = "run with the same options to resume, or pass --overwrite to start over"
        else:
            first = "to start over, delete " + ", ".join(str(self.path / n) for n in names)
        return f"{first}, or choose another {self.option}"

    def _finished_message(self, stage: StageOnDisk) -> str:
        r = stage.results
        what = ", ".join([*([f"{r['steps']} optimizer steps"] if "steps" in r else []),
                          *([f"model in {r['model']}"] if "model" in r else [])]) or f"see {self.path / stage.name}"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime((self.path / stage.name / RESULTS).stat().st_mtime))
        overwrite = "Pass --overwrite to delete it and train again from step 0, " if self.overwrite is not None else ""
        return (f"{self.path} holds a finished {self.command} run ({what}; finished {when}). {overwrite}choose another "
                f"{self.option}, or leave {self.option} out for a fresh {RUNS}/{self.command}-TIME directory")


# --- one run per seed -----------------------------------------------------------------------
def run_seeds(run: Callable[[Any, Path], Path], config: Any, run_dir: str | os.PathLike,
              seeds: Sequence[int]) -> dict[int, Path]:
    """`run(config with seed=s, run_dir/seed-<s>)` for every seed -> {seed: its run directory}. Each seed's
    directory is a RunDir of its own with its seed's config: all are checked before the first seed runs
    (a refusal comes before any work), and each is held while its seed runs."""
    dirs = {s: RunDir(Path(run_dir) / f"seed-{s}") for s in seeds}
    configs = {s: dataclasses.replace(config, seed=s) for s in seeds}
    for s in seeds:
        dirs[s].check(configs[s])
    for s in seeds:
        with dirs[s].hold():
            report = run(configs[s], dirs[s].path)
        if distributed.is_main():
            print(report, flush=True)
    return {s: d.path for s, d in dirs.items()}


# --- what is on disk ----------------------------------------------------------------------------
def stages_on_disk(run_dir: Path) -> dict[str, StageOnDisk]:
    """The stage directories of `run_dir`: finished (results.json) or cut short (a resume checkpoint)."""
    out = {}
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()) if run_dir.is_dir() else []:
        f = d / RESULTS
        if f.is_file():
            try:
                results = json.loads(f.read_text())
                record = results.get(INPUTS) if isinstance(results, dict) else None
            except (OSError, ValueError):
                results, record = {}, None
            record = record if isinstance(record, dict) else {}
            reads = record.get("config")
            out[d.name] = StageOnDisk(d.name, True, frozenset(reads) if isinstance(reads, list) else None,
                                      tuple(record.get("stages") or ()), results if isinstance(results, dict) else {})
        elif _has_checkpoint(d / "resume"):
            out[d.name] = StageOnDisk(d.name, False)
    return out


def _has_checkpoint(resume: Path) -> bool:
    """A resume checkpoint (also one a save cut between its two renames left aside), without touching it."""
    return (resume / "state" / "engine.json").exists() or any(resume.glob(".state.old-*/engine.json"))


def _ordered(on_disk: dict[str, StageOnDisk]) -> list[str]:
    """The stages in dependency order (by their records), ties by name."""
    done: list[str] = []
    left = sorted(on_disk)
    while left:
        ready = [n for n in left if all(a in done or a not in on_disk for a in on_disk[n].after)] or left[:1]
        done += ready
        left = [n for n in left if n not in ready]
    return done


def no_effect(config: Any, prefix: str = "") -> set[str]:
    """The leaf keys of `config` that cannot change results: its sections' `NO_EFFECT` fields."""
    out = {prefix + n for n in getattr(type(config), "NO_EFFECT", ())}
    for f in dataclasses.fields(config) if dataclasses.is_dataclass(config) else ():
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out |= no_effect(value, f"{prefix}{f.name}.")
    return out


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    return a == b or (a != a and b != b)  # NaN is NaN


def _defaults(config: Any) -> dict:
    """The flattened defaults of `config`'s class ({} when it cannot be built without arguments)."""
    try:
        return flatten(json.loads(json.dumps(to_dict(type(config)()))))
    except Exception:  # noqa: BLE001 - a config class with required fields: no defaults to compare with
        return {}


def _diff(changed: dict[str, tuple], spell: Callable[[str], str] | None = None) -> str:
    """'rl.steps 6 -> 8, seed 0 -> 1' (the HF commands: '--kl-coef 0.1 -> 0.2 (rl.kl_coef)')."""
    return ", ".join(f"{spell(k)} {a!r} -> {b!r} ({k})" if spell else f"{k} {a!r} -> {b!r}"
                     for k, (a, b) in changed.items())
