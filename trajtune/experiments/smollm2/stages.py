"""The smollm2 recipe's stages (`fn(ctx) -> results`, run by `trajtune.runs.stages.run_stages`) and the held-out
evaluation of each model: base (the pretrained model), sft (the warm start), grpo (RL from the warm start)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...seeding import derive
from .config import Config
from .task import heldout, is_number, opening, write_data

def resolve(spec: str) -> str:
    """The local folder of `spec` (`trajtune.models.hub.resolve_model`: a folder, a short name such as
    smollm2-135m, a hub id or a .gguf file); a spec that names no model is one `ConfigError` line."""
    from ...config import ConfigError
    from ...models.hub import ModelPathError, resolve_model

    try:
        return str(resolve_model(spec))
    except ModelPathError as e:
        raise ConfigError(f"smollm2: model.path: {e}") from None


def data_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "data"


# --- evaluation -------------------------------------------------------------------------------
def heldout_eval(ctx, path: str | Path, config: Config) -> dict:
    """The model saved at `path` (loaded from disk, as a user would) on the held-out problems, through its chat
    template and stop tokens (what `trajtune chat` and GRPO see): greedy, and `eval_samples` samples per problem at
    the sampling section's temperature. accuracy: the reply (ended by a stop token) is the answer; format: it is
    one integer. `per_problem`: each problem's greedy 0/1 and its share of right samples (two models on the same
    problems compare paired, `report.gain`). `examples`: the first `n_examples` problems' greedy and first sampled
    replies."""
    import torch

    from ...models.hf import load_policy, load_tokenizer
    from ...text.chat import ChatRenderer

    tok, policy = load_tokenizer(path), load_policy(path)
    engine = ctx.engine(policy, device=config.model.device)
    r, problems, k = ChatRenderer(tok), heldout(config.n_eval, tuple(config.ops)), config.eval_samples
    prompts = [r.prompt_ids(r.start(opening(config.system, p))) for p in problems]
    stop, n, s = list(r.stop_ids), config.sampling.max_new_tokens, config.sampling
    greedy = engine.sample(prompts, n, greedy=True, stop_ids=stop, pad_id=r.pad_id)
    g = torch.Generator().manual_seed(derive(config.seed, 5, stride=7919))
    drawn = engine.sample([q for q in prompts for _ in range(k)], n, g, temperature=s.temperature, top_k=s.top_k,
                          top_p=s.top_p, stop_ids=stop, pad_id=r.pad_id, draw=s.draw,
                          share_prompts=s.share_prompts)  # task-major: k samples of problem 0 first

    def scored(out, answers):
        texts = [r.action_text(x) for x in out.tokens]
        right = [bool(st) and t.strip() == a for t, st, a in zip(texts, out.stopped, answers, strict=True)]
        form = [bool(st) and is_number(t) for t, st in zip(texts, out.stopped, strict=True)]
        return texts, right, mean(form)

    answers = [p.answer for p in problems]
    g_text, g_right, g_form = scored(greedy, answers)
    s_text, s_right, s_form = scored(drawn, [a for a in answers for _ in range(k)])
    per_problem = {"greedy": [float(x) for x in g_right],  # each problem's score: a paired comparison's items
                   "sampled": [mean(s_right[i * k:(i + 1) * k]) for i in range(len(problems))]}
    return {"greedy_accuracy": mean(g_right), "greedy_format": g_form, "sampled_accuracy": mean(s_right),
            "sampled_format": s_form, "per_problem": per_problem,
            "per_op": {op: mean(t.strip() == p.answer for t, p in zip(g_text, problems, strict=True) if p.op == op)
                       for op in config.ops if any(p.op == op for p in problems)},
            "examples": [[p.question, p.answer, g_text[i], s_text[i * k]]
                         for i, p in enumerate(problems[: config.n_examples])]}


def mean(xs) -> float:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else 0.0


# --- the stages -------------------------------------------------------------------------------
def stage_base(ctx) -> dict:
    """The data files, and the pretrained model's scores (the 'before')."""
    config = ctx.config
    path = resolve(config.model.path)
    if ctx.logger is not None:  # rank 0 writes
        write_data(config, data_dir(ctx.run_dir))
    return {"model": path, "data": str(data_dir(ctx.run_dir)), "eval": heldout_eval(ctx, path, config)}


def method_config(cls, ctx, model: str, data: str, **sections):
    """The method's own run config, as its command builds it from flags: --model `model`, --data
    run_dir/data/<data>, the model and output sections of this config, `sections`."""
    return cls(model=replace(ctx.config.model, path=model), data=str(data_dir(ctx.run_dir) / data),
               output=ctx.config.output, **sections)


def checked(ctx, c, module):
    """What the method's command checks before its model loads (`hf/recipe.check`), with the stage directory as
    the method's run directory (the recipe's runner keeps the resume state)."""
    from ..hf.recipe import check

    return check(c, ctx.dir, module.prepare)


def stage_sft(ctx) -> dict:
    """The warm start: `trajtune sft --model <base> --data data/sft.jsonl` (its checks, then its stage function)."""
    from ..hf import sft

    c = method_config(sft.SFTRun, ctx, resolve(ctx.config.model.path), "sft.jsonl", sft=ctx.config.sft,
                      optim=ctx.config.sft_optim)
    return evaluated(ctx, sft.train(ctx, c, checked(ctx, c, sft), home=ctx.name))


def stage_grpo(ctx) -> dict:
    """RL: `trajtune grpo --model sft/model --data data/prompts.jsonl --reward data/rewards.py:exact_answer`."""
    from ..hf import grpo

    reward = f"{data_dir(ctx.run_dir) / 'rewards.py'}:exact_answer"
    c = method_config(grpo.GRPORun, ctx, str(ctx.run_dir / "sft" / "model"), "prompts.jsonl", reward=[reward],
                      rl=ctx.config.grpo, sampling=ctx.config.sampling, optim=ctx.config.grpo_optim)
    return evaluated(ctx, grpo.train(ctx, c, checked(ctx, c, grpo), home=ctx.name))


def evaluated(ctx, results: dict) -> dict:
    """A training stage's results plus the held-out scores of the model it saved."""
    return {**results, "eval": heldout_eval(ctx, results["model"], ctx.config)}
