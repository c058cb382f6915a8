"""Runs tinker-cookbook's own `recipes/sl_loop.py` or `recipes/rl_loop.py` (tinker-cookbook 0.5.8, unmodified)
against a Tinker server, offline, and prints the metrics the recipe logged. Not a test: tests/recipes/
test_tinker_cookbook.py and tests/real_model/test_tinker_real.py run it as a subprocess with the cookbook's own
Python (`TRAJTUNE_COOKBOOK_PYTHON`: a separate venv, since tinker-cookbook pins transformers<=5.5.4), as a user
would run it:

    .venv-cookbook/bin/python tests/recipes/tinker_cookbook_runner.py sl --base-url http://127.0.0.1:8000 \\
        --model /path/to/hf-model --log-path /tmp/sl --steps 12 --batch-size 8 --lr 2e-3

It imports no trajtune (the cookbook's venv need not have it). The recipe's `main(Config(...))` runs as written;
only the three things that would reach the Hugging Face hub are replaced, each through a public seam:

1. the tokenizer: `--model` a local HF folder is loaded by the cookbook itself (`get_tokenizer` takes a folder);
   `--tokenizer DIR` registers that folder under the model's name (`tokenizer_utils.register_tokenizer`), for a
   server-side name such as `smollm2-135m`;
2. the renderer: `model_info.get_recommended_renderer_name` knows only hub names, so it answers `--renderer`
   (default "role_colon", the cookbook's model-agnostic `User: ...\\n\\nAssistant: ...` format);
3. the data: `datasets.load_dataset` returns a small local `DatasetDict` in the shape the recipe reads
   (sl_loop: HuggingFaceH4/no_robots rows with `messages`; rl_loop: openai/gsm8k rows with `question` and an
   `answer` ending in `#### N`): one-digit additions, which a tiny model can learn.

`--resume-from tinker://.../weights/NAME` writes that state into `LOG_PATH/checkpoints.jsonl` at batch 0 before
the recipe starts, so the recipe resumes from it by its own code path
(`create_training_client_from_state_with_optimizer`): rl_loop from an SL-trained state, which gives a tiny
model a reward above 0 (from a random start GSM8K's `\\boxed{}` answers score 0, every group's advantages are 0
and rl_loop skips every training step).

Output: one line `METRICS {json}` per step the recipe logged (its `metrics.jsonl`), then `CHECKPOINTS {json}`
(its `checkpoints.jsonl`), so a caller needs only stdout."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."  # rl_loop's question_suffix


def problems(n: int, seed: int) -> list[tuple[int, int]]:
    """n one-digit additions a+b (a, b in 1..4: 7 possible answers), drawn from Random(seed)."""
    rng = random.Random(seed)
    return [(rng.randint(1, 4), rng.randint(1, 4)) for _ in range(n)]


def sl_rows(n: int, seed: int) -> list[dict]:
    """no_robots-shaped rows: a user question in rl_loop's wording and the boxed answer."""
    return [{"messages": [{"role": "user", "content": f"What is {a}+{b}?{SUFFIX}"},
                          {"role": "assistant", "content": f"\\boxed{{{a + b}}}"}]}
            for a, b in problems(n, seed)]


def rl_rows(n: int, seed: int) -> list[dict]:
    """gsm8k-shaped rows: `question` and an `answer` whose last line is `#### N` (the recipe's grader reads it)."""
    return [{"question": f"What is {a}+{b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
            for a, b in problems(n, seed)]


def install_patches(args: argparse.Namespace) -> None:
    """The three offline seams (module docstring); the recipe's code is not touched."""
    import datasets

    from tinker_cookbook import model_info, tokenizer_utils

    if args.tokenizer:
        from transformers import AutoTokenizer

        folder = str(Path(args.tokenizer).resolve())
        tokenizer_utils.register_tokenizer(args.model, lambda: AutoTokenizer.from_pretrained(folder))
    elif not os.path.isdir(args.model):
        sys.exit(f"--model {args.model!r} is not a local folder: give --tokenizer DIR (a folder with its HF "
                 "tokenizer), as nothing is fetched from the hub here")
    model_info.get_recommended_renderer_name = lambda name: args.renderer
    n = args.batch_size * args.steps
    rows = sl_rows(n, args.seed) if args.recipe == "sl" else rl_rows(n, args.seed)
    local = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})
    datasets.load_dataset = lambda *a, **k: local


def seed_resume(log_path: Path, state_path: str) -> None:
    """The recipe's own resume record (checkpoint_utils' checkpoints.jsonl row) pointing at `state_path`."""
    log_path.mkdir(parents=True, exist_ok=True)
    with open(log_path / "checkpoints.jsonl", "w") as f:
        f.write(json.dumps({"name": "warm-start", "batch": 0, "state_path": state_path}) + "\n")


def run(args: argparse.Namespace) -> None:
    install_patches(args)
    log_path = Path(args.log_path)
    if args.resume_from:
        seed_resume(log_path, args.resume_from)
    common = dict(base_url=args.base_url, log_path=str(log_path), model_name=args.model,
                  batch_size=args.batch_size, learning_rate=args.lr, lora_rank=args.lora_rank,
                  save_every=args.save_every, max_steps=args.steps)
    if args.recipe == "sl":
        from tinker_cookbook.recipes import sl_loop

        sl_loop.main(sl_loop.Config(**common, max_length=args.max_length))
    else:
        from tinker_cookbook.recipes import rl_loop

        rl_loop.main(rl_loop.Config(**common, group_size=args.group_size, max_tokens=args.max_tokens))
    for name, tag in (("metrics.jsonl", "METRICS"), ("checkpoints.jsonl", "CHECKPOINTS")):
        path = log_path / name
        for line in (path.read_text().splitlines() if path.exists() else []):
            print(tag, line, flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe", choices=("sl", "rl"), help="sl_loop or rl_loop")
    p.add_argument("--base-url", required=True, help="the Tinker server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="base_model: a local HF folder, or a server name with --tokenizer")
    p.add_argument("--tokenizer", default=None, help="a folder with the model's HF tokenizer (for a server name)")
    p.add_argument("--log-path", required=True, help="the recipe's log_path (metrics.jsonl, checkpoints.jsonl)")
    p.add_argument("--renderer", default="role_colon", help="the cookbook renderer (default role_colon)")
    p.add_argument("--steps", type=int, default=10, help="max_steps (the data has batch-size x steps rows)")
    p.add_argument("--batch-size", type=int, default=8, help="batch_size: conversations (sl) or prompts (rl)")
    p.add_argument("--group-size", type=int, default=8, help="rl: samples per prompt")
    p.add_argument("--max-tokens", type=int, default=16, help="rl: max_tokens per sample")
    p.add_argument("--max-length", type=int, default=512, help="sl: max_length of a datum")
    p.add_argument("--lr", type=float, default=1e-4, help="learning_rate")
    p.add_argument("--lora-rank", type=int, default=32, help="lora_rank (0: full fine-tune, where the server allows)")
    p.add_argument("--save-every", type=int, default=0, help="save_every (0: only the recipe's final save)")
    p.add_argument("--seed", type=int, default=0, help="the data's seed")
    p.add_argument("--resume-from", default=None, help="a tinker://.../weights/NAME state the recipe resumes from")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "group_size", "max_tokens", "max_length"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: needs at least 1")
    if args.lora_rank < 0:
        p.error(f"--lora-rank {args.lora_rank}: needs 0 (full fine-tune) or more")
    return args


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    run(parse())
