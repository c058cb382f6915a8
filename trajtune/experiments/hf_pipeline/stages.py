"""The HF pipeline's stages (`fn(ctx) -> results`, run by `trajtune.runs.stages.run_stages`) and its held-out
evaluation of every stage's saved model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...seeding import derive
from .config import MAX_ANSWER, Config
from .task import (build_llama, completion_prompt, completion_text, conversation, data_dir, model_dir, problems,
                   question, train_digit_tokenizer, write_corpora, write_jsonl)


# --- evaluation -------------------------------------------------------------------------------
def heldout_eval(ctx, path: Path, config: Config) -> dict:
    """pass@1 on the held-out problems of the model saved at `path` (loaded from disk, as a user would):
    chat greedy, chat sampled (mean over `eval_samples` at temperature 1) and pass@k from those samples,
    through the chat template and stop tokens (what `trajtune chat` and GRPO see); completion greedy
    (`a+b=` -> `c\\n`, the base model's question); the right answers' NLL; `per_problem`, each problem's
    greedy 0/1 and share of right samples (a paired comparison's items). A reply counts only if it ends with a
    stop token."""
    import torch

    from ...engine.distributed import launched_distributed
    from ...envs.arithmetic import heldout_tasks
    from ...evaluation import mean_pass_at_k
    from ...models.hf import load_policy, load_tokenizer
    from ...text.chat import ChatRenderer

    tok, policy = load_tokenizer(path), load_policy(path)
    device = None if config.model.device == "cuda" and launched_distributed() else config.model.device
    engine = ctx.engine(policy, device=device)
    r, tasks, k, n = ChatRenderer(tok), list(heldout_tasks())[: config.n_eval], config.eval_samples, MAX_ANSWER
    answers = [t.answer for t in tasks]
    chat = [r.prompt_ids(r.start([{"role": "user", "content": question(t)}])) for t in tasks]
    stop, pad = list(r.stop_ids), r.pad_id

    def correct(samples, answers, text) -> list[bool]:  # one per sample
        return [s and text(x) == a for x, s, a in zip(samples.tokens, samples.stopped, answers, strict=True)]

    greedy = engine.sample(chat, n, greedy=True, stop_ids=stop, pad_id=pad)
    g = torch.Generator().manual_seed(derive(config.seed, 5, stride=7919))
    drawn = correct(engine.sample([p for p in chat for _ in range(k)], n, g, stop_ids=stop, pad_id=pad),
                    [a for a in answers for _ in range(k)], r.action_text)  # task-major: k samples of task 0 first
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    raw = [tok(completion_prompt(t), add_special_tokens=False)["input_ids"] for t in tasks]
    base = correct(engine.sample(raw, n, greedy=True, stop_ids=newline, pad_id=pad), answers,
                   lambda x: tok.decode(x[:-1]))
    chat = correct(greedy, answers, r.action_text)
    per_task = [drawn[i * k:(i + 1) * k] for i in range(len(tasks))]
    return {"chat_greedy": mean(chat), "chat_sampled": mean(drawn),
            "chat_answer_nll": answer_nll(engine, r, tasks),
            "chat_pass_at_k": mean_pass_at_k(per_task, k),
            "completion_greedy": mean(base),
            # each problem's score, in the held-out order: two models on the same problems compare paired
            "per_problem": {"chat_greedy": [float(x) for x in chat], "chat_sampled": [mean(x) for x in per_task],
                            "completion_greedy": [float(x) for x in base]},
            "examples": [[question(t), r.action_text(x)] for t, x in zip(tasks[:6], greedy.tokens, strict=False)]}


def answer_nll(engine, renderer, tasks) -> float:
    """Mean NLL per answer token (the digits and the stop token) of the held-out conversations, the answer
    right: a smooth measure of what pass@1 counts."""
    import torch

    from ...trajectory import collate

    batch = collate([renderer.render(conversation(t)) for t in tasks], renderer.pad_id)
    with torch.no_grad():
        logp_B_T = engine.forward(batch).logprobs  # [B, T-1]
    mask = batch.action_mask.to(logp_B_T.device)  # [B, T-1]: the answer's tokens
    return float(-(logp_B_T * mask).sum() / mask.sum())


def mean(xs) -> float:
    xs = list(xs)
    return sum(map(float, xs)) / len(xs)


# --- the stages -------------------------------------------------------------------------------
def stage_base(ctx) -> dict:
    """The corpora, the tokenizer trained on them, a random Llama from a config; its (zero) scores."""
    from ...engine.distributed import barrier

    config, run_dir = ctx.config, ctx.run_dir
    sample = problems(config, 2_000, 0)
    corpus = [completion_text(t) for t in sample] + [f"user\n{question(t)}\nassistant\n{t.answer}\nsystem\n"
                                                     for t in sample[:500]]
    tok = train_digit_tokenizer(corpus, config.llama.vocab_size)
    model = build_llama(config.llama, tok, config.seed)
    path = model_dir(run_dir, ctx.name)
    if ctx.logger is not None:  # rank 0 writes
        write_corpora(config, run_dir, tok)
        model.save_pretrained(str(path))
        tok.save_pretrained(str(path))
    barrier()
    return {"model": str(path), "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
            "data": str(data_dir(run_dir)), "eval": heldout_eval(ctx, path, config)}


def text_data(tokenizer, path: Path, limit: int):
    """The pretraining corpus as `Prepared` trajectories whose every token is trained (plain text, no template)."""
    from ...sources.data import read_rows
    from ...trajectory import Owner, Trajectory
    from ..hf.prepare import Prepared

    items = []
    for row in read_rows(path):
        ids = tokenizer(row.data["text"], add_special_tokens=False)["input_ids"]
        if len(ids) > limit:
            raise ValueError(f"{row.where}: {len(ids)} tokens > the length budget {limit}")
        t = Trajectory(info={"source": row.where})
        t.append(ids, Owner.POLICY, 0)
        items.append(t)
    return Prepared(tokenizer=tokenizer, items=items, limit=limit)


def method_config(cls, ctx, previous: str, data: str, **sections):
    """The method's own run config, as its command builds it from flags: --model the previous stage's
    model/, --data run_dir/data/<data>, the model and output sections of this config, `sections`."""
    model = replace(ctx.config.model, path=str(model_dir(ctx.run_dir, previous)))
    return cls(model=model, data=str(data_dir(ctx.run_dir) / data), output=ctx.config.output, **sections)


def checked(ctx, c, module):
    """What the method's command checks before its model loads (`hf/recipe.check`: the device, the rows,
    every length, the reward functions, the schedule), with the stage directory as the method's run
    directory: the pipeline's runner keeps the resume state (<stage>/resume), so the method finds no run
    of its own there."""
    from ..hf.recipe import check

    return check(c, ctx.dir, module.prepare)


def stage_pretrain(ctx) -> dict:
    """`sft.train` (what `trajtune sft` runs) on raw text: every token trained."""
    from ...models.hf import load_tokenizer
    from ..hf import sft
    from ..hf.recipe import check_device
    from ..hf.prepare import budget, planned

    c = method_config(sft.SFTRun, ctx, "base", "pretrain.jsonl", sft=ctx.config.pretrain,
                      optim=ctx.config.pretrain_optim, schedule=ctx.config.pretrain_schedule)
    check_device(c.model.device)
    data = text_data(load_tokenizer(c.model.path), Path(c.data), budget(c.model)[0])
    return evaluated(ctx, sft.train(ctx, c, planned(c, data, "sft", c.sft.batch_size, "samples"), home=ctx.name))


def stage_sft(ctx) -> dict:
    """`trajtune sft --model pretrain/model --data data/sft.jsonl`: its checks, then its stage function."""
    from ..hf import sft

    c = method_config(sft.SFTRun, ctx, "pretrain", "sft.jsonl", sft=ctx.config.sft, optim=ctx.config.sft_optim,
                      schedule=ctx.config.sft_schedule)
    return evaluated(ctx, sft.train(ctx, c, checked(ctx, c, sft), home=ctx.name))


def stage_pairs(ctx) -> dict:
    """On-policy preference pairs: the SFT model's samples on fresh problems, labelled by the verifier;
    a problem with a wrong sample gives {"prompt", "chosen": the sum, "rejected": that sample} (a wrong
    reply that ended with the stop token preferred)."""
    import torch

    from ...models.hf import load_policy, load_tokenizer
    from ...text.chat import ChatRenderer

    config, path = ctx.config, model_dir(ctx.run_dir, "sft")
    tok, policy = load_tokenizer(path), load_policy(path)
    engine, r, n = ctx.engine(policy), ChatRenderer(tok), config.pair_samples
    tasks = problems(config, config.n_pair_prompts, 2)
    prompts = [r.prompt_ids(r.start([{"role": "user", "content": question(t)}])) for t in tasks]
    out = engine.sample([p for p in prompts for _ in range(n)], config.sampling.max_new_tokens,
                        torch.Generator().manual_seed(derive(config.seed, 2, stride=7919)), stop_ids=list(r.stop_ids),
                        pad_id=r.pad_id)
    replies = [(r.action_text(x).strip(), stopped) for x, stopped in zip(out.tokens, out.stopped, strict=True)]
    rows, right = [], 0
    for i, t in enumerate(tasks):
        mine = replies[i * n:(i + 1) * n]  # task-major: the n samples of task i
        right += sum(x == t.answer and stopped for x, stopped in mine)
        wrong = sorted((not stopped, x) for x, stopped in mine if x and x != t.answer)
        if wrong:
            rows.append({"prompt": question(t), "chosen": t.answer, "rejected": wrong[0][1]})
    if not rows:
        raise ValueError("pairs: the SFT model answered every sampled problem right; nothing for DPO to prefer")
    if ctx.logger is not None:  # rank 0 writes
        write_jsonl(data_dir(ctx.run_dir) / "pairs.jsonl", rows)
    return {"pairs": len(rows), "problems": len(tasks), "samples_per_problem": n,
            "wrong_share": 1 - right / (n * len(tasks))}


def stage_dpo(ctx) -> dict:
    """`trajtune dpo --model sft/model --data data/pairs.jsonl`."""
    from ..hf import dpo

    c = method_config(dpo.DPORun, ctx, "sft", "pairs.jsonl", dpo=ctx.config.dpo, optim=ctx.config.dpo_optim,
                      schedule=ctx.config.dpo_schedule)
    return evaluated(ctx, dpo.train(ctx, c, checked(ctx, c, dpo), home=ctx.name))


def stage_grpo(ctx) -> dict:
    """`trajtune grpo --model dpo/model --data data/prompts.jsonl --reward data/rewards.py:exact_answer`."""
    from ..hf import grpo

    reward = f"{data_dir(ctx.run_dir) / 'rewards.py'}:exact_answer"
    c = method_config(grpo.GRPORun, ctx, "dpo", "prompts.jsonl", reward=[reward], rl=ctx.config.grpo,
                      sampling=ctx.config.sampling, optim=ctx.config.grpo_optim)
    return evaluated(ctx, grpo.train(ctx, c, checked(ctx, c, grpo), home=ctx.name))


def evaluated(ctx, results: dict) -> dict:
    """A training stage's results plus the held-out scores of the model it saved."""
    return {**results, "eval": heldout_eval(ctx, Path(results["model"]), ctx.config)}
