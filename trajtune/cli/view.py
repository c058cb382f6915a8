"""`trajtune view RUN_DIR`: the page of a run's recorded episodes (`trajtune.runs.view`, whose docstring says what
it shows)."""

from __future__ import annotations

from ..config import ConfigError
from ..runs.view import write_view


def add_view_parser(sub) -> None:
    p = sub.add_parser("view", help="write a static HTML page of a run's recorded episodes, token by token")
    p.add_argument("run_dir", help="the run directory (or one episodes.jsonl)")
    p.add_argument("--out", help="where to write the page (default RUN_DIR/view.html)")
    p.add_argument("--steps", help="only these steps, e.g. 1,50,100")
    p.add_argument("--stage", action="append", help="only this stage (repeatable)")
    p.add_argument("--tokenizer", help="a tokenizer.json or a Hugging Face model directory for every stage "
                        "(default: each stage's policy's, found in RUN_DIR through the stage graph)")
    p.set_defaults(func=cmd_view)


def cmd_view(args) -> int:
    steps = None
    if args.steps:
        try:
            steps = [int(s) for s in args.steps.split(",") if s.strip()]
        except ValueError:
            raise ConfigError(f"--steps: expected comma-separated integers like 1,50,100, got {args.steps!r}") from None
    out = write_view(args.run_dir, args.out, steps, args.stage, args.tokenizer)
    print(out)
    return 0
