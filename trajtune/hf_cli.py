"""`trajtune sft|rm|dpo|grpo|rft --model DIR --data FILE`: post-train a local Hugging Face causal LM.

    trajtune sft  --model ./my-model --data chats.jsonl --steps 100 --lr 1e-5 --out runs/sft
    trajtune dpo  --model runs/sft/model --data pairs.jsonl --beta 0.1 --lora-r 16 --out runs/dpo
    trajtune grpo --model runs/sft/model --data prompts.jsonl --reward my_rewards.py:exact --out runs/grpo
    trajtune rm   --model ./my-model --data pairs.jsonl --out runs/rm
    trajtune rft  --model ./my-model --data prompts.jsonl --reward my_rewards:exact --rounds 4

The same options as a recipe: `experiment = "hf"` with a `[config]` table of
`HFConfig` fields (see trajtune/recipes/hf_sft.toml).

Data formats (trajtune.data): `messages` (sft), `prompt`/`completion` (sft),
`prompt`/`chosen`/`rejected` or implicit-prompt `chosen`/`rejected` (dpo, rm),
`prompt` + columns with a reward function `module:function` (grpo, rft).
Each command is a thin wiring of the library: load the model behind the
engine, turn rows into trajectories / pairs / prompt tasks, call the algorithm
loop (train_sft, train_reward_model, train_dpo, train_rl, train_rft), save.

Everything is checked before the model is loaded (the tokenizer only, seconds):
the options (`HFConfig`), every row (`trajtune.data`: file, line, field) and every
sample's length. A sample longer than `--max-length` (sft/rm/dpo), or a prompt
whose tokens + `--max-new-tokens` exceed it (grpo/rft), is an error naming file,
line, field and lengths; `--drop-long` skips such rows instead (counted on stderr).
`--max-length` is capped at the model's context (`max_position_embeddings` of
its config.json) where that is smaller.

Writes into `--out`: metrics.jsonl, config.json, checkpoints/step-N (every
--save-every steps) and model/ -- a directory `AutoModelForCausalLM.from_pretrained`
loads (LoRA merged; the adapter alone in model/adapter; reward models add
value_head.safetensors).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

COMMANDS = {
    "sft": "supervised fine-tuning on conversations or prompt/completion rows",
    "rm": "train a Bradley-Terry reward model (value head) on preference pairs",
    "dpo": "direct preference optimisation (and ipo / simpo / orpo) on preference pairs",
    "grpo": "RL with group baselines (GRPO, RLOO, REINFORCE; PPO with --advantage gae) and a reward function",
    "rft": "rejection-sampling fine-tuning (expert iteration) with a reward function",
}


@dataclass
class HFConfig:
    command: Literal["sft", "rm", "dpo", "grpo", "rft"] = "sft"
    """which method (the subcommand)"""
    model: str = ""
    """local Hugging Face model directory (config.json, weights, tokenizer)"""
    data: str = ""
    """JSONL file of rows (formats: see trajtune.data)"""
    out: str = "runs/hf"
    """run directory: metrics.jsonl, checkpoints/, model/"""
    reward: str = ""
    """grpo/rft: reward function 'module:function' or 'file.py:function', TRL signature fn(prompts, completions, **columns)"""
    steps: int = 100
    """optimizer steps (rft: SFT steps per round)"""
    batch_size: int = 8
    """sft: conversations, rm/dpo: pairs per step"""
    micro_batch_size: int = 0
    """rows per forward/backward chunk (gradient accumulation; 0: whole batch at once)"""
    lr: float = 1e-5
    """peak learning rate (AdamW)"""
    warmup_steps: int = 0
    """linear warm-up steps"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """clip the gradient norm (0: off)"""
    lora_r: int = 0
    """LoRA rank (0: train all weights); the reference is then the base model with adapters off"""
    lora_alpha: float = 32.0
    """LoRA alpha"""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """autocast precision of forward passes (weights stay fp32)"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory"""
    max_length: int = 2048
    """sft/rm/dpo: longest sample in tokens; grpo/rft: prompt + completion budget (capped at the model's context)"""
    drop_long: bool = False
    """skip samples / prompts that do not fit --max-length (default: stop with an error listing them)"""
    save_every: int = 0
    """write a checkpoint every this many steps: an HF-format snapshot and the resume state (0: only the final
    model, and the resume state only on Ctrl-C / SIGTERM); a rerun with the same --out resumes from it"""
    device: str = "cpu"
    """torch device ("cpu", "cuda", "cuda:1", "mps")"""
    seed: int = 0
    """seeds batches, sampling and initialisation"""
    beta: float = 0.1
    """dpo: KL strength (simpo: reward scale)"""
    loss: Literal["dpo", "ipo", "simpo", "orpo"] = "dpo"
    """dpo: which preference loss"""
    prompts_per_step: int = 8
    """grpo: prompts per step"""
    group_size: int = 8
    """grpo: completions per prompt; rft: samples per prompt and round"""
    max_new_tokens: int = 64
    """grpo/rft: generation budget per completion"""
    temperature: float = 1.0
    """grpo/rft: sampling temperature"""
    advantage: Literal["grpo", "rloo", "reinforce", "dr_grpo", "gae"] = "grpo"
    """grpo: advantage estimator (gae: PPO with a value head)"""
    epochs: int = 1
    """grpo: passes over each batch of samples (> 1: PPO-style clipped reuse)"""
    kl_coef: float = 0.0
    """grpo: KL(pi || ref) weight (k3 estimator in the loss)"""
    backend: Literal["sampler", "generate"] = "sampler"
    """grpo/rft: generation backend: trajtune's KV-cached sampler or HF model.generate"""
    rounds: int = 4
    """rft: sample -> select -> train rounds"""
    threshold: float = 1.0
    """rft: reward needed to keep a sample"""

    def __post_init__(self) -> None:
        import math

        from .config import check_ranges

        if not self.model or not self.data:
            raise ValueError("HFConfig: --model and --data are required")
        if self.command in ("grpo", "rft") and not self.reward:
            raise ValueError(f"HFConfig: {self.command} needs --reward module:function")
        check_ranges(self, "HFConfig", label=lambda name: "--" + name.replace("_", "-"),
                     counts=("batch_size", "max_length", "prompts_per_step", "group_size", "max_new_tokens", "rounds",
                             "epochs"),
                     non_negative=("steps", "micro_batch_size", "warmup_steps", "lora_r", "save_every", "weight_decay",
                                   "grad_clip", "kl_coef"),
                     positive=("lr", "beta", "temperature", "lora_alpha"))
        if not math.isfinite(self.threshold):
            raise ValueError(f"HFConfig: --threshold must be a finite number, got {self.threshold!r}")
        if self.command == "grpo" and self.group_size < 2 and self.advantage != "gae":
            raise ValueError(f"HFConfig: --group-size must be >= 2 with --advantage {self.advantage} (a group baseline "
                             f"compares the completions of one prompt; with 1 every advantage is 0), got {self.group_size}")
        if self.command in ("grpo", "rft") and self.max_new_tokens >= self.max_length:
            raise ValueError(f"HFConfig: --max-new-tokens {self.max_new_tokens} leaves no room for a prompt within "
                             f"--max-length {self.max_length} (prompt + completion budget)")


def run_hf(config: HFConfig, run_dir: str | Path | None = None) -> Path:
    """Run one command end to end; returns the directory of the saved model."""
    import torch

    from . import data as D
    from .algorithms.dpo import DPOConfig, train_dpo
    from .algorithms.reward_model import RewardModelConfig, train_reward_model
    from .algorithms.rft import RFTConfig, train_rft
    from .algorithms.rl import RLConfig, train_rl
    from .algorithms.sft import SFTConfig, train_sft
    from .config import to_dict
    from .engine import LocalEngine, OptimConfig
    from .envs.base import SingleTurnEnv
    from .generation import make_backend
    from .metrics import MetricsLogger
    from .resume import Checkpointer
    from .models.hf import LoraSettings, load_policy, load_tokenizer
    from .rollout import make_collect
    from .text.chat import ChatRenderer

    c = config
    out = Path(run_dir or c.out)
    # 0. validate everything before any work: the loop's settings, the tokenizer, every row and its length
    optim = OptimConfig(lr=c.lr, weight_decay=c.weight_decay, grad_clip=c.grad_clip, warmup_steps=c.warmup_steps)
    if c.command == "sft":
        loop_config = SFTConfig(steps=c.steps, batch_size=c.batch_size, eval_every=c.save_every, seed=c.seed)
    elif c.command == "rm":
        loop_config = RewardModelConfig(steps=c.steps, batch_size=c.batch_size, seed=c.seed)
    elif c.command == "dpo":
        loop_config = DPOConfig(steps=c.steps, batch_size=c.batch_size, loss=c.loss, beta=c.beta, seed=c.seed)
    elif c.command == "grpo":
        loop_config = RLConfig(steps=c.steps, tasks_per_step=c.prompts_per_step, group_size=c.group_size,
                               advantage=c.advantage,
                               surrogate="ppo" if c.advantage == "gae" or c.epochs > 1 else "reinforce",
                               epochs=c.epochs, kl_coef=c.kl_coef, seed=c.seed)
    else:
        loop_config = RFTConfig(rounds=c.rounds, samples_per_task=c.group_size, steps_per_round=c.steps,
                                batch_size=c.batch_size, threshold=c.threshold, seed=c.seed)
    tokenizer = load_tokenizer(c.model)
    renderer = ChatRenderer(tokenizer)
    rows = D.read_rows(c.data)
    limit, budget = c.max_length, f"--max-length {c.max_length}"
    context = model_context(c.model)
    if context is not None and context < limit:
        limit, budget = context, f"the model's context ({context} tokens, max_position_embeddings; --max-length {c.max_length})"
    # 1. the data, in the shape the command's loop takes (too long: an error, or skipped with --drop-long)
    if c.command == "sft":
        field_of = {r.where: "messages" if "messages" in r.data else "prompt+completion" for r in rows}

        def too_long(t):
            where = t.info["source"]
            return f"{where}: field {field_of.get(where, 'messages')!r}: {len(t)} tokens" if len(t) > limit else None

        items = _fit(D.sft_trajectories(rows, renderer), budget, c.drop_long, too_long)
    elif c.command in ("rm", "dpo"):
        def too_long(pair):
            (chosen, rejected), n = pair, max(len(pair[0]), len(pair[1]))
            side = "chosen" if len(chosen) >= len(rejected) else "rejected"
            return (f"{chosen.info['source']}: field {side!r}: {n} tokens (chosen {len(chosen)}, rejected "
                    f"{len(rejected)}, prompt included)" if n > limit else None)

        items = _fit(D.preference_pairs(rows, renderer), budget, c.drop_long, too_long)
    else:
        verifier = D.reward_verifier(D.load_reward_function(c.reward))
        lengths = prompt_lengths(D.prompt_tasks(rows), renderer)

        def too_long(task):
            n = lengths[task] + c.max_new_tokens
            return (f"{task.where}: field 'prompt': {lengths[task]} tokens + --max-new-tokens {c.max_new_tokens} = {n}"
                    if n > limit else None)

        items = _fit(list(lengths), budget, c.drop_long, too_long, noun="prompts")
    checkpointer = Checkpointer(out, every=c.save_every)
    resuming = (checkpointer.state_dir / "engine.json").exists()
    if resuming:
        check_same_run(out / "config.json", to_dict(c))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_dict(c), indent=1))
    torch.manual_seed(c.seed)
    # 2. the model behind the engine
    lora = LoraSettings(r=c.lora_r, alpha=c.lora_alpha) if c.lora_r else None
    value_head = c.command == "rm" or (c.command == "grpo" and c.advantage == "gae")
    policy = load_policy(c.model, value_head=value_head, lora=lora, gradient_checkpointing=c.gradient_checkpointing)
    engine = LocalEngine(policy, optim, c.device, autocast=None if c.precision == "fp32" else c.precision,
                         micro_batch_size=c.micro_batch_size)
    trainable = policy.num_parameters(trainable=True)
    print(f"trajtune {c.command}: {c.model} ({policy.num_parameters():,} parameters, {trainable:,} trained), "
          f"{len(items)} {'prompts' if c.command in ('grpo', 'rft') else 'samples'} from {c.data} -> {out}", flush=True)

    def checkpoint(step: int) -> dict:
        if c.save_every and step % c.save_every == 0:
            policy.save_pretrained(out / "checkpoints" / f"step-{step}", tokenizer, meta={"step": step})
        return {}

    # 3. the loop (resumed from out/state when an earlier run of the same command left one)
    pad = renderer.pad_id
    t0 = time.time()
    if resuming:
        print(f"resuming from {checkpointer.state_dir}", flush=True)
    with MetricsLogger(out) as logger, checkpointer:
        ck = checkpointer
        if c.command == "sft":
            train_sft(engine, items, loop_config, pad, logger, evaluate=checkpoint, checkpointer=ck)
        elif c.command == "rm":
            train_reward_model(engine, items, loop_config, pad, logger, evaluate=checkpoint, eval_every=c.save_every,
                               checkpointer=ck)
        elif c.command == "dpo":
            train_dpo(engine, items, loop_config, pad, logger, evaluate=checkpoint, eval_every=c.save_every,
                      checkpointer=ck)
        else:
            collect = make_collect(make_backend(c.backend, engine, pad), lambda: SingleTurnEnv(verifier), renderer,
                                   max_turns=1, max_tokens=limit, max_action_tokens=c.max_new_tokens,
                                   temperature=c.temperature)
            if c.command == "grpo":
                train_rl(engine, items, collect, loop_config, pad, logger, evaluate=checkpoint, eval_every=c.save_every,
                         checkpointer=ck)
            else:
                train_rft(engine, items, collect, loop_config, pad, logger, evaluate=checkpoint, checkpointer=ck)
    # 4. save in the Hugging Face format
    final = policy.save_pretrained(out / "model", tokenizer, meta={"command": c.command, "steps": engine.step})
    print(f"done in {time.time() - t0:.0f}s: {engine.step} optimizer steps; model saved to {final} "
          f"(load with AutoModelForCausalLM.from_pretrained({str(final)!r}))", flush=True)
    return final


RESUMABLE_CHANGES = {"steps", "save_every", "device", "micro_batch_size", "out"}
"""options a resumed run may change (more steps, where it runs); any other change is a different run"""


def check_same_run(saved: Path, current: dict) -> None:
    """Refuse to resume a checkpoint written by a run with other settings (names the options)."""
    try:
        before = json.loads(saved.read_text())
    except (OSError, ValueError):
        raise ValueError(f"{saved.parent}: has a resume checkpoint but no readable config.json; "
                         f"use another --out or delete {saved.parent / 'state'}") from None
    changed = sorted(k for k in set(before) | set(current)
                     if k not in RESUMABLE_CHANGES and before.get(k) != current.get(k))
    if changed:
        diff = ", ".join(f"--{k.replace('_', '-')} {before.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ValueError(f"{saved.parent} holds a checkpoint of a run with other settings ({diff}); resume with "
                         f"the same options, or use another --out (or delete {saved.parent / 'state'}) to start over")


def model_context(model_dir: str | Path) -> int | None:
    """The model's context length (`max_position_embeddings` in its config.json, also under
    `text_config`), or None where the file does not say."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        n = c.get("max_position_embeddings") if isinstance(c, dict) else None
        if isinstance(n, int) and n > 0:
            return n
    return None


def prompt_lengths(tasks: list, renderer) -> dict:
    """task -> tokens the sampler is given for its first turn (the rollout's own measure:
    the opening messages plus the generation prompt); a prompt the template cannot start
    from (e.g. one ending in an assistant turn) is a DataError naming its row."""
    from .data import DataError
    from .text.chat import TemplateError

    out = {}
    for t in tasks:
        opening = [{"role": "user", "content": t.prompt}] if isinstance(t.prompt, str) else t.prompt
        try:
            out[t] = len(renderer.prompt_ids(renderer.start(opening)))
        except TemplateError as e:
            raise DataError(f"{t.where}: field 'prompt': {e}") from e
    return out


def _fit(items: list, budget: str, drop_long: bool, too_long, noun: str = "samples", show: int = 5) -> list:
    """Check every item against the length budget before any work (never truncate: the end carries
    the answer). `too_long(item)` is None, or 'file:line: field ...: lengths' for an item that does not
    fit. Any such item is an error listing the first `show`, unless `drop_long` skips them."""
    from .data import DataError

    verdicts = [(x, too_long(x)) for x in items]
    bad = [m for _, m in verdicts if m]
    if bad and not drop_long:
        more = f"\n  ... and {len(bad) - show} more" if len(bad) > show else ""
        raise DataError(f"{len(bad)} of {len(items)} {noun} do not fit {budget}:\n  " + "\n  ".join(bad[:show]) + more +
                        "\nshorten or remove these rows, raise --max-length (up to the model's context), or pass --drop-long to skip them")
    kept = [x for x, m in verdicts if not m]
    if bad:
        print(f"trajtune: skipped {len(bad)} of {len(items)} {noun} longer than {budget} (--drop-long)", file=sys.stderr)
    if not kept:
        raise DataError(f"no {noun[:-1]} fits {budget}")
    return kept


# --- argparse ---------------------------------------------------------------------------
def add_hf_parsers(subparsers) -> None:
    """Add `sft rm dpo grpo rft` to an argparse subparsers object; each sets `func=cmd_hf`.

    Every `HFConfig` field is an option (`--batch-size`, `--lora-r`, ...) with its docstring as help.
    """
    from typing import get_args, get_origin, get_type_hints

    from .config import field_docs

    docs, types = field_docs(HFConfig), get_type_hints(HFConfig)
    for command, help_text in COMMANDS.items():
        p = subparsers.add_parser(command, help=f"HF model: {help_text}", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        for f in fields(HFConfig):
            if f.name == "command":
                continue
            flag = "--" + f.name.replace("_", "-")
            kw: dict = {"default": f.default, "help": f"{docs.get(f.name, '')} (default {f.default!r})"}
            tp = types[f.name]
            if tp is bool:
                p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
                continue
            if get_origin(tp) is Literal:
                kw["choices"] = list(get_args(tp))
            else:
                kw["type"] = tp
            if f.name in ("model", "data"):
                kw["required"] = True
            p.add_argument(flag, **kw)
        p.set_defaults(func=cmd_hf, hf_command=command)


def cmd_hf(args) -> int:
    from .config import ConfigError
    from .resume import RunInterrupted

    values = {f.name: getattr(args, f.name) for f in fields(HFConfig) if f.name != "command"}
    try:
        config = HFConfig(command=args.hf_command, **values)
        run_hf(config)
    except (ValueError, FileNotFoundError) as e:  # DataError, ModelPathError, TemplateError, config errors
        raise ConfigError(str(e)) from e
    except RunInterrupted as e:
        print(f"trajtune: {e}; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajtune.hf_cli")
    add_hf_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"trajtune: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
