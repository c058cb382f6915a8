"""Record and replay: the batches a run trained on, kept on disk, and trained on again without sampling.

    Recording(inner, directory)   `inner`'s episodes as the loop takes them, each take written to `directory`
    Replayed(directory)           a recording's episodes again, draw by draw: no sampler, no environment, no reward

A replay of a recording with the recorded run's training settings ends with the recorded run's weights bit for
bit (the loop reads nothing of its source but the episodes, their metrics and the draw's generator, all recorded);
with a training-side change (another lr, surrogate, correction) it tests that change on the same rollouts.
The run's sampling section asks for either (`sampling.record`, `sampling.replay`; `trajtune replay RUN_DIR`
reruns a recorded run on its recording), and the builder (`build.episode_source`) wraps or replaces the source.

One JSON file per take, <directory>/step-000003.json (a loop that draws again within a step, DAPO's refills:
step-000003-1.json, -2, ...), written atomically (`checkpoint.write_json`: a killed run leaves no half file):

    step, n, tasks    the draw (its task names: a replay checks the loop asks for the same draw, `Draw.same_as`)
    trajs             every episode, all its fields (`runs.resume.trajectories_to_json`: ids, owners, turns, the
                      sampler's logprobs, reward, group, info, outcome, temperature, unterminated, versions)
    metrics, behind   the Episodes' metrics (a replay drops the time/* ones: it did not spend that time) and lag
    generator         the draw's generator state after the sampling (hex; the loop shuffles minibatches with it)

A resumed run appends: at its first take (the step it resumes at) the files of that step and later ones -- what
the part of the run past its last checkpoint recorded, taken again now -- are removed, the earlier ones kept. A
directory holds one run's recording (a stage directory is one run's: `runs.rundir`); a replay writes into a new
run directory, never the recorded one. Under torchrun rank 0 writes (every rank holds the whole batch) and every
rank reads. `after_update` metrics (a sampler's sync check) are not recorded: a replay has no sampler to check.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..checkpoint import CheckpointError, read_json, write_json
from ..engine.distributed import is_main
from ..runs.resume import trajectories_from_json, trajectories_to_json
from .base import Draw, Episodes, Schedule, Source, Wrapper, task_name

RECORDING = "recording"
"""a stage directory's recording: <stage dir>/recording"""
FORMAT = 1
_FILE = re.compile(r"step-(\d+)(?:-(\d+))?\.json")


def file_name(step: int, take: int = 0) -> str:
    """The file of step `step`'s `take`-th draw (0: the loop's own; 1, 2 ...: further draws of the step)."""
    return f"step-{step:06d}{f'-{take}' if take else ''}.json"


def recorded_steps(directory: str | Path) -> list[int]:
    """The steps a recording holds (sorted; a step with several draws once)."""
    d = Path(directory)
    found = {int(m.group(1)) for p in (d.iterdir() if d.is_dir() else ()) if (m := _FILE.fullmatch(p.name))}
    return sorted(found)


def find_recording(replay: str | Path, stage: str | None = None) -> Path:
    """The recording `replay` names: a recording directory itself (it holds step files), or a run directory whose
    <stage>/recording holds the stage's. One clear line (ValueError) when neither is there."""
    path = Path(replay)
    if recorded_steps(path):
        return path
    if stage is not None and recorded_steps(path / stage / RECORDING):
        return path / stage / RECORDING
    where = f" nor {path / (stage or '<stage>') / RECORDING}" if stage is not None else ""
    raise ValueError(f"replay: no recording in {path}{where} (no step-*.json files: record a run with "
                     "sampling.record / --record first)")


class Recording(Wrapper):
    """`inner`'s episodes, each take written to `directory` as the loop takes it (module docstring). `write`: this
    process writes (default: rank 0 under torchrun, else True)."""

    def __init__(self, inner: Source, directory: str | Path, write: bool | None = None):
        super().__init__(inner)
        self.directory = Path(directory)
        self.write = is_main() if write is None else write
        self._started = False
        self._step, self._take = -1, 0

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        episodes = self.inner.take(draw, ahead)
        self._take = self._take + 1 if draw.step == self._step else 0
        self._step = draw.step
        if self.write:
            if not self._started:
                self._start(draw.step)
            write_json(self.directory / file_name(draw.step, self._take), episodes_json(draw, episodes))
        return episodes

    def _start(self, step: int) -> None:
        """The first take (step `step`: 0, or where a resumed run starts): the files of `step` on are removed (the
        part of the run past its last checkpoint recorded them; they are taken again now)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for p in self.directory.iterdir():
            m = _FILE.fullmatch(p.name)
            if m and int(m.group(1)) >= step:
                p.unlink()
        self._started = True


class Replayed:
    """A recording's episodes, for the draws the run recorded (module docstring): the loop's `take(draw)` gets the
    episodes recorded for it, the draw's generator set to the recorded state. A draw that is not the recorded one,
    or a step the recording lacks, stops the run in one line naming the file."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ValueError(f"replay: no recording directory {self.directory}")
        self._step, self._take = -1, 0

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        self._take = self._take + 1 if draw.step == self._step else 0
        self._step = draw.step
        path = self.directory / file_name(draw.step, self._take)
        what = f"step {draw.step}" + (f"'s draw {self._take + 1}" if self._take else "")
        if not path.is_file():
            last = recorded_steps(self.directory)
            held = f"steps {last[0]}-{last[-1]}" if last else "no step"
            raise ValueError(f"replay: {path} is missing: the recording holds {held}, not {what} (the recorded run "
                             "stopped before it, or drew differently)")
        try:
            saved = read_json(path)
            recorded = Draw([SimpleNamespace(name=n) for n in saved["tasks"]], int(saved["n"]), torch.Generator(),
                            int(saved["step"]))
            episodes = episodes_from(saved, draw.generator)
        except (CheckpointError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"replay: {path}: not a recorded step ({e})") from None
        if not recorded.same_as(draw):
            raise ValueError(f"replay: {path} holds {_describe(recorded)}, but the run asks for {_describe(draw)} "
                             f"at {what} (a different task list, group size or seed than the recorded run's)")
        return episodes

    def after_update(self, engine: Any) -> dict[str, float]:
        return {}

    def pending(self) -> list[Episodes]:
        return []

    def restore(self, episodes: list[Episodes]) -> None:
        """Nothing to take back: every step is read from the recording."""

    def close(self) -> None:
        pass

    def __enter__(self) -> "Replayed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def episodes_json(draw: Draw, episodes: Episodes) -> dict[str, Any]:
    """One take as the recording's JSON (module docstring)."""
    g = episodes.generator
    return {"format": FORMAT, "step": draw.step, "n": draw.n, "tasks": [task_name(t) for t in draw.tasks],
            "behind": episodes.behind, "metrics": {k: float(v) for k, v in episodes.metrics.items()},
            "generator": None if g is None else bytes(g.get_state().tolist()).hex(),
            "trajs": trajectories_to_json(episodes.trajs)}


def episodes_from(saved: dict[str, Any], generator: torch.Generator | None) -> Episodes:
    """The Episodes of a recorded take; `generator` (the draw's) is set to the recorded state and carried."""
    if saved.get("format") != FORMAT:
        raise ValueError(f"format {saved.get('format')!r}, this trajtune reads {FORMAT}")
    state = saved["generator"]
    if state is not None:
        generator = generator if generator is not None else torch.Generator()
        generator.set_state(torch.tensor(list(bytes.fromhex(state)), dtype=torch.uint8))
    else:
        generator = None
    metrics = {k: v for k, v in saved["metrics"].items() if not k.startswith("time/")}
    return Episodes(trajectories_from_json(saved["trajs"]), metrics, generator, int(saved["step"]),
                    int(saved["behind"]))


def _describe(draw: Draw) -> str:
    names = [task_name(t) for t in draw.tasks]
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} tasks)" if len(names) > 4 else "")
    return f"step {draw.step}: {draw.n} episode(s) of [{shown}]"
