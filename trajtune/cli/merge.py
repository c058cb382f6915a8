"""`trajtune merge MODEL MODEL ... --out DIR`: merge checkpoints of one architecture (RLHF book ch.3, appendix C).

    trajtune merge runs/a/model runs/b/model --out runs/soup                        # the mean (a model soup)
    trajtune merge runs/a/model runs/b/model --weights 0.3 0.7 --out runs/mix       # weight interpolation
    trajtune merge runs/math/model runs/code/model --method task_arithmetic \\
        --base runs/sft/model --weights 1 0.5 --out runs/both                       # base + sum l_i (theta_i - base)
    trajtune merge runs/a/model runs/b/model --method slerp --t 0.3 --out runs/s   # spherical, two models

A model is a trajtune checkpoint or a Hugging Face save_pretrained directory (safetensors weights, shards too);
the merge keeps the first model's config, tokenizer and file layout (`trajtune.models.merging`).
"""

from __future__ import annotations

import argparse

from ..config import ConfigError


def add_merge_parser(subparsers) -> None:
    p = subparsers.add_parser("merge", help="merge checkpoints of one architecture (linear, task arithmetic, slerp)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", metavar="MODEL", help="model directories (trajtune or Hugging Face), hub ids "
                   "(org/name), .gguf files or catalog names (smollm2-135m; `trajtune models list`)")
    p.add_argument("--out", required=True, help="the merged model's directory (must not exist)")
    p.add_argument("--method", default="linear", choices=("linear", "task_arithmetic", "slerp"),
                   help="linear: sum w_i theta_i; task_arithmetic: base + sum w_i (theta_i - base); slerp: two models")
    p.add_argument("--weights", type=float, nargs="+", metavar="W",
                   help="one per model (linear: sum to 1, default equal; task_arithmetic: default 1 each)")
    p.add_argument("--base", help="task_arithmetic: the model the others were fine-tuned from")
    p.add_argument("--t", type=float, default=0.5, help="slerp: 0 is the first model, 1 the second (default 0.5)")
    p.set_defaults(func=run_merge)


def run_merge(args) -> int:
    from ..checkpoint import CheckpointError
    from ..models.hub import ModelPathError, resolve_model
    from ..models.merging import merge_dirs

    try:
        models = [resolve_model(m) for m in args.models]  # a hub id / .gguf / catalog name -> its folder
        base = resolve_model(args.base) if args.base else None
        out = merge_dirs(models, args.out, args.method, args.weights, base, args.t)
    except (ValueError, FileExistsError, CheckpointError, ModelPathError) as e:  # the user's input: exit 2, one line
        raise ConfigError(str(e)) from None
    print(f"merged {len(args.models)} models ({args.method}) into {out}")
    return 0
