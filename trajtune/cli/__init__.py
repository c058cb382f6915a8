"""Command line: `trajtune run [RECIPE]`, `trajtune list`, `trajtune gym ...`,
`trajtune sft|rm|dpo|grpo|rft --model DIR --data FILE` (Hugging Face models, cli/hf.py).

    trajtune run                          # the built-in default recipe
    trajtune run recipe.toml --set config.sft.steps=50 --run-dir runs/x
    trajtune run addition                 # a built-in recipe by name
    trajtune run --seeds 0,1,2            # the default recipe over three seeds, mean +- sd
    trajtune run agent --seeds 0,1 --kernels avx512,avx2   # an experiment's own option (agent/kernels.py)
    trajtune run agent --dry-run          # every check a run makes before its first step; nothing written
    trajtune list                         # built-in recipes with one-line descriptions
    trajtune view RUN_DIR                 # a static HTML page of the episodes a run recorded
    trajtune replay RUN_DIR --out NEW     # train again on the episodes a --record run trained on (bit for bit)
    trajtune decontaminate --train F --eval F   # evaluation rows sharing 8 words / 50 characters with training data
    trajtune models fetch smollm2-135m    # a real model into the cache (--model smollm2-135m then works everywhere)
    trajtune endpoint --model DIR         # the model behind an OpenAI-compatible endpoint, sessions recorded
    trajtune tinker-serve                 # the Tinker training API: tinker scripts and tinker-cookbook run here

This module: run, list and the subcommands' entry; each other command is a module of its own:
hf.py (sft | rm | dpo | grpo | rft | rm-eval), chat.py, endpoint.py, gym.py, view.py, replay.py, decontaminate.py,
merge.py, models.py, vllm_serve.py, tinker.py.
"""

from __future__ import annotations

import argparse
import builtins
import errno
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from ..sources.process import SyncError
from ..checkpoint import CheckpointError
from ..config import ConfigError, from_dict, load_toml, set_dotted
from ..engine.distributed import close_distributed, init_distributed, is_main
from ..experiments import get_experiment
from ..experiments.base import Call, Experiment
from ..runs.rundir import RunDir
from ..runs.stages import RunFailed

DEFAULT_RECIPE = "agent"
RECIPE_KEYS = ("experiment", "description", "config")


def builtin_recipes() -> dict[str, Path]:
    """name -> path of every TOML recipe shipped in trajtune/recipes/."""
    root = resources.files("trajtune.recipes")
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml")}


def resolve_recipe(name_or_path: str | None) -> Path:
    name_or_path = name_or_path or DEFAULT_RECIPE
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return p
    recipes = builtin_recipes()
    if name_or_path not in recipes:
        import difflib

        close = difflib.get_close_matches(name_or_path, list(recipes), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"no recipe file or built-in recipe named {name_or_path!r}{hint} (see `trajtune list`)")
    return recipes[name_or_path]


def load_recipe(path: Path, overrides: list[str] = ()) -> tuple[Experiment, Any, dict]:
    """Parse and validate a recipe: (the experiment, its Config instance, raw dict)."""
    raw = load_toml(path)
    for a in overrides:
        set_dotted(raw, a)
    for key in raw:
        if key not in RECIPE_KEYS:
            import difflib

            close = difflib.get_close_matches(key, RECIPE_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid top-level keys: {', '.join(RECIPE_KEYS)}"
            raise ConfigError(f"{path}: unknown key {key!r}{hint}")
    if "experiment" not in raw:
        raise ConfigError(f"{path}: missing key 'experiment' (which experiment to run)")
    try:
        module = get_experiment(raw["experiment"])
    except KeyError as e:
        raise ConfigError(f"{path}: {e.args[0]}") from e
    given = f" with --set {' --set '.join(overrides)}" if overrides else ""  # the key may be the override's
    config = from_dict(module.Config, raw.get("config", {}), where=f"{path}{given}: [config]")
    return module, config, raw


def cmd_run(args, extra: list[str] = ()) -> int:
    """Run a recipe in its run directory (`trajtune.runs.rundir.RunDir`: a fresh runs/<recipe>-TIME or
    --run-dir, held for the whole run; what an earlier run there means is the RunDir's policy, which the
    experiment's stage runner applies before any stage runs). `extra`: the arguments this command does not know,
    the experiment's own options (`Experiment.parse_options`, e.g. the agent's --kernels)."""
    path = resolve_recipe(args.recipe)
    experiment, config, raw = load_recipe(path, args.set or [])
    name = raw["experiment"]
    if args.seeds and experiment.run_over_seeds is None:
        raise ConfigError(f"experiment {name!r} does not support --seeds (no report over seeds)")
    seeds = parse_seeds(args.seeds) if args.seeds else None  # before the run directory exists
    options = experiment_options(experiment, name, list(extra), seeds)
    call = Call(path, list(args.set or []), options)
    rank, world = init_distributed()  # under torchrun (WORLD_SIZE > 1) join the process group; else (0, 1)
    print = builtins.print if rank == 0 else (lambda *a, **k: None)  # only rank 0 talks  # noqa: A001
    run_dir = RunDir(Path(args.run_dir)) if args.run_dir else RunDir.fresh(path.stem, create=not args.dry_run)
    print(f"trajtune: running {path} (experiment {name}) in {run_dir.path}"
          + (f" on {world} processes" if world > 1 else ""), flush=True)
    if args.dry_run:
        print(dry_run(experiment, config, run_dir, seeds))
        return 0
    t0 = time.time()
    with run_dir.hold():  # one run per directory: a second one is refused, naming this one
        if seeds and experiment.run_over_seeds is not None:
            report = experiment.run_over_seeds(config, run_dir.path, seeds, call)
        else:
            report = experiment.run(config, run_dir.path)
    print(f"done in {time.time() - t0:.0f}s")
    print(report)
    return 0


def experiment_arguments(argv: list[str], recipe: str | None, extra: list[str]) -> tuple[str | None, list[str]]:
    """(the recipe, the experiment's own arguments) from what `trajtune run` parsed and left over. An experiment's
    option takes one value (`--kernels K,K` or `--kernels=K,K`); argparse, not knowing the option, takes its value
    for the recipe when the recipe is left out or comes later: give the value back to its option."""
    if recipe is not None:
        i = argv.index(recipe)
        before = argv[i - 1] if i else ""
        if before in extra and before.startswith("-") and "=" not in before:
            j = extra.index(before) + 1
            extra, recipe = extra[:j] + [recipe] + extra[j:], None
    bare = [k for k, x in enumerate(extra) if not x.startswith("-")
            and not (k and extra[k - 1].startswith("-") and "=" not in extra[k - 1])]
    if recipe is None and bare:
        recipe = extra[bare[0]]
        extra = extra[: bare[0]] + extra[bare[0] + 1:]
    return recipe, extra


def experiment_options(experiment: Experiment, name: str, extra: list[str], seeds: list[int] | None):
    """The experiment's own options, parsed and checked (`Experiment.parse_options`); an argument of an experiment
    without options is refused naming it."""
    import argparse

    if experiment.parse_options is not None:
        return experiment.parse_options(extra, seeds)
    if extra:
        raise ConfigError(f"experiment {name!r} does not support {' '.join(extra)} (`trajtune run` options: "
                          "--set, --run-dir, --dry-run, --seeds; it has none of its own)")
    return argparse.Namespace()


def dry_run(experiment: Experiment, config, run_dir: RunDir, seeds: list[int] | None) -> str:
    """`trajtune run --dry-run`: every check a run makes before its first step, nothing written -> what a run
    would do. The run directory's policy (in use? refused? what is read back, what runs again), for each
    seed's directory with --seeds; then the experiment's own `dry_run(config, run_dir)` where it has
    one: the files the recipe names (data, model directories, reward functions) exist and parse."""
    import dataclasses

    run_dir.check_free()
    dirs = [(RunDir(run_dir.path / f"seed-{s}"), dataclasses.replace(config, seed=s)) for s in seeds or ()]
    lines = []
    for d, c in dirs or [(run_dir, config)]:
        d.check_free()
        lines.append(d.check(c, rerun=getattr(getattr(c, "runner", None), "rerun", None)).describe())
    if experiment.dry_run is not None:
        lines.append(experiment.dry_run(config, run_dir.path))
    return "\n".join(["dry run: the recipe is valid", *lines, "nothing trained, nothing written"])


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2] (for `--seeds`)."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--seeds: expected comma-separated integers like 0,1,2, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected distinct integers like 0,1,2, got {text!r}")
    return seeds


def cmd_list(args) -> int:
    rows = []
    for name, path in sorted(builtin_recipes().items()):
        raw = load_toml(path)
        rows.append((name + (" (default)" if name == DEFAULT_RECIPE else ""), raw.get("description", "")))
    width = max(len(r[0]) for r in rows)
    for name, desc in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trajtune", description="Post-train language-model policies.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a recipe (default: the built-in default recipe)",
                       epilog="An experiment may take options of its own after these (`Experiment.parse_options`): "
                       "the agent's --kernels K,K (with --seeds: the seeds again under each other CPU kernel set).")
    r.add_argument("recipe", nargs="?", help="a recipe .toml file or the name of a built-in recipe")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a recipe value, e.g. config.sft.steps=50")
    r.add_argument("--run-dir", help="where to write metrics, checkpoints and the report (default runs/NAME-TIME)")
    r.add_argument("--dry-run", action="store_true", help="make every check a run makes before its first step (the "
                   "recipe, the run directory, the files it names) and stop; nothing is written")
    r.add_argument("--seeds", metavar="S,S,...", help="run once per seed (e.g. 0,1,2) into RUN_DIR/seed-S and report "
                   "mean +- sd (experiments with seeds_report)")
    r.set_defaults(func=cmd_run)
    ls = sub.add_parser("list", help="list the built-in recipes")
    ls.set_defaults(func=cmd_list)
    from .view import add_view_parser  # `trajtune view RUN_DIR`: the recorded episodes as an HTML page

    add_view_parser(sub)
    from .replay import add_replay_parser  # `trajtune replay RUN_DIR`: a recorded run trained again on its recording

    add_replay_parser(sub)
    from .decontaminate import add_decontaminate_parser  # `trajtune decontaminate --train F --eval F`

    add_decontaminate_parser(sub)
    try:
        from .gym import add_gym_parser
    except ImportError:  # gyms not installed in this build
        pass
    else:
        add_gym_parser(sub)
    try:
        from .hf import add_hf_parsers
    except ImportError:  # pragma: no cover
        pass
    else:
        add_hf_parsers(sub)
    from .chat import add_chat_parser  # `trajtune chat --model DIR` (imports torch / transformers only when run)

    add_chat_parser(sub)
    from .endpoint import add_endpoint_parser  # `trajtune endpoint --model DIR`: the OpenAI-compatible endpoint

    add_endpoint_parser(sub)
    from .vllm_serve import add_vllm_serve_parser  # `trajtune vllm-serve --model DIR` (imports vLLM only when run)

    add_vllm_serve_parser(sub)
    from .merge import add_merge_parser  # `trajtune merge A B --out DIR`: weight interpolation, task arithmetic

    add_merge_parser(sub)
    from .models import add_models_parser  # `trajtune models list|fetch`: the catalog (smollm2-135m) and the cache

    add_models_parser(sub)
    from .tinker import add_tinker_parser  # `trajtune tinker-serve`: the Tinker training API (tinker, the cookbook)

    add_tinker_parser(sub)
    return p


ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
"""OSErrors of the machine, not of trajtune (a full disk, a read-only or forbidden place): one line, exit 1"""


def main(argv: list[str] | None = None) -> int:
    """Run a command. Exit codes: 0 done; 2 a user error found before or while starting (options,
    recipe, data, model files, device, run directory in use or finished); 1 the run failed (a save
    that could not be written, every step skipped); 130 interrupted (a checkpoint was written)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.func is not cmd_run:  # only `trajtune run` hands arguments on (to the experiment)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.recipe, extra = experiment_arguments(sys.argv[1:] if argv is None else argv, args.recipe, extra)
    code = 1
    try:
        code = args.func(args, extra) if extra else args.func(args)
        return code
    except ConfigError as e:
        return _fail(f"{e}", 2)
    except (CheckpointError, RunFailed, SyncError) as e:
        return _fail(f"{e}", 1)
    except OSError as e:
        if e.errno not in ENVIRONMENT_ERRNOS:
            raise
        return _fail(f"cannot write {f'{e.filename}: ' if e.filename else ''}{e.strerror or e}", 1)
    except KeyboardInterrupt as e:  # resume.RunInterrupted: a checkpoint was written first
        saved = f" ({e})" if str(e) else ""
        hint = getattr(e, "resume_hint", None) or "run the same command again to resume"
        print(f"trajtune: interrupted{saved}; {hint}", file=sys.stderr)
        return 130
    finally:
        close_distributed(failed=code != 0)  # under torchrun: leave the process group while the interpreter lives


def _fail(message: str, code: int) -> int:
    """Say `message` once (rank 0 under torchrun: every rank meets the same error) and return `code`."""
    if is_main():
        print(f"trajtune: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
