"""`trajtune replay RUN_DIR [--out NEW_DIR] [--set KEY=VALUE ...]`: a recorded run trained again on its recording.

    trajtune grpo ... --record --out runs/a            # a run that records the episodes it trained on
    trajtune replay runs/a --out runs/a-replay         # the same training on them: the same weights, bit for bit
    trajtune replay runs/a --out runs/a-lr --set optim.lr=3e-5 --set rl.surrogate=ppo   # a training-side change

RUN_DIR's config.json is the run's config; the experiment it belongs to is the one whose config it is (every
registered experiment's `Config` is tried: exactly one reads it back unchanged, the HF commands' included). Every
sampling section that recorded (`record = true`) is set to replay RUN_DIR (`sampling.replay`: each stage reads its
<stage>/recording; `trajtune.sources.record`), on-policy in the trainer (the recording keeps how far behind its
episodes were sampled); `--set` then changes the config's keys as config.json spells them (`optim.lr=3e-5`; a
leading `config.` is accepted). The replay runs in NEW_DIR (default runs/replay-<time>), never in RUN_DIR.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import ConfigError, flatten, from_dict, set_dotted, to_dict
from ..runs.rundir import CONFIG, RunDir
from ..sources.record import RECORDING


def add_replay_parser(sub) -> None:
    p = sub.add_parser("replay", help="train again on the episodes a run recorded (--record), without sampling")
    p.add_argument("run_dir", help="the recorded run's directory (its config.json and <stage>/recording/)")
    p.add_argument("--out", help="the replay's run directory (default runs/replay-TIME); never RUN_DIR")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="change a setting for the replay, as config.json spells it, e.g. optim.lr=3e-5")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from ..engine.distributed import init_distributed, is_main

    recorded = Path(args.run_dir)
    experiment, config = replay_config(recorded, args.set)
    if args.out and Path(args.out).resolve() == recorded.resolve():
        raise ConfigError(f"--out {args.out}: that is the recorded run; a replay writes into a new directory")
    init_distributed()  # under torchrun: join the process group (rank 0 names a fresh directory for every rank)
    out = RunDir(Path(args.out)) if args.out else RunDir.fresh("replay")
    if is_main():
        print(f"trajtune replay: {recorded} ({experiment}) on its recording, in {out.path}", flush=True)
    from ..experiments import get_experiment

    with out.hold():
        report = get_experiment(experiment).run(config, out.path)
    if is_main():
        print(report)
    return 0


def replay_config(recorded: Path, changes: list[str]) -> tuple[str, Any]:
    """(the experiment's name, the recorded run's config set to replay its recording with `changes`); a ConfigError
    in one line for a directory that is not a recorded run."""
    file = recorded / CONFIG
    if not file.is_file():
        raise ConfigError(f"{recorded}: not a run directory (no {CONFIG})")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file}: unreadable ({e})") from None
    leaves = flatten(data)
    sections = [k[: -len("record")] for k, v in leaves.items()
                if k.rsplit(".", 1)[-1] == "record" and v is True and k[: -len("record")] + "replay" in leaves]
    if not sections:
        raise ConfigError(f"{recorded}: the run recorded nothing (sampling.record was off: record with --record or "
                          "[config.sampling] record = true)")
    if not any(recorded.glob(f"*/{RECORDING}/step-*.json")):
        raise ConfigError(f"{recorded}: no recording (no <stage>/{RECORDING}/step-*.json): the run stopped before "
                          "its first step")
    name, cls = experiment_of(data, recorded)
    for prefix in sections:
        backend = prefix + "backend"
        for key, value in (("record", "false"), ("replay", json.dumps(str(recorded.resolve()))),
                           ("max_staleness", "0"), ("sampler_process", "false")):
            set_dotted(data, f"{prefix}{key}={value}")
        if flatten(data).get(backend) == "vllm":
            set_dotted(data, f'{backend}="sampler"')
    for change in changes:
        set_dotted(data, change.removeprefix("config."), where="--set")
    return name, from_dict(cls, data, where=f"{file} with the replay's settings")


def experiment_of(data: dict, recorded: Path) -> tuple[str, Any]:
    """The experiment whose config `data` is: the one registered experiment whose `Config` reads it back
    unchanged -> (name, Config)."""
    from ..experiments import EXPERIMENTS, get_experiment

    found = []
    for name in EXPERIMENTS:
        cls = get_experiment(name).Config
        try:
            same = json.loads(json.dumps(to_dict(from_dict(cls, data)))) == data
        except (ConfigError, ValueError, TypeError, KeyError):
            continue
        if same:
            found.append((name, cls))
    if len(found) != 1:
        which = f"those of {', '.join(n for n, _ in found)}" if found else "no registered experiment's"
        raise ConfigError(f"{recorded / CONFIG}: the config is {which}; cannot tell which experiment to replay")
    return found[0]
