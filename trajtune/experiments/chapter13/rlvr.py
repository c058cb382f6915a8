"""Post-training ch.13 step 4 (REPRODUCE B6-B7): RL on a verifiable reward, and the SFT control.

    B6  coldstart  a tiny "calculator" (dim 64, 2 layers) SFT'd on worked 2-digit additions
        grpo       GRPO from it: 200 steps x 32 prompts x 8 samples, (R - mean)/(std + 1e-4),
                   one update per batch (nothing to clip), no KL -- as in the seed
    B7  control    200 more SFT steps on fresh worked examples instead of RL

Evaluation (`math_eval`, the seed's): on the 256 held-out problems, greedy accuracy;
pass@1..16 from 16 samples per problem (unbiased estimator); distinct answers among
the 16 samples; the entropy of the first answer token; and the inference token budget
of the greedy and the sampled passes (RLHF book ch.16: generated tokens, in all and per
sample). GRPO also logs, per step, the share of groups whose 8 rewards are all equal (no
signal for a group baseline).
"""

from __future__ import annotations

import copy

import torch

from ...algorithms.rl import train_rl
from ...algorithms.sft import train_sft
from ...sources.episodes import EpisodeRunner, EpisodeSource, sample_episodes
from ...sources.sampler import Decoder, Sampler, SamplerSettings
from ...sources.overlap import overlapped
from ...engine import Engine
from ...envs.arithmetic import arithmetic_env, arithmetic_tokenizer, heldout_tasks, train_tasks
from ...evaluation import distinct_answers, generated_tokens, mean_pass_at_k
from ...logprobs import entropy_from_logits
from ...models.tiny import TinyConfig, TinyTransformer, load_model
from ...text.render import Renderer
from ...trajectory import Owner, Trajectory, collate
from ...seeding import derive

KS = (1, 2, 4, 8, 16)
MAX_ANSWER = 4  # up to three digits and <|end|>, as the seed's 4 sampled characters


def demos(r: Renderer, tasks) -> list[Trajectory]:
    return [r.render([{"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.answer}]) for t in tasks]


def answer_settings(**settings) -> SamplerSettings:
    """How an arithmetic answer is sampled: MAX_ANSWER tokens, `settings` (temperature, greedy, ...)."""
    return SamplerSettings(max_new_tokens=MAX_ANSWER, **settings)


def source_for(policy: Sampler | EpisodeRunner, r: Renderer) -> EpisodeSource:
    """The arithmetic gym's episodes sampled by `policy` (one answer each: `Decoder(engine.sample,
    answer_settings())`, or a sampler process), as a source."""
    return EpisodeSource(policy, arithmetic_env, r, max_turns=1, max_tokens=32)


@torch.no_grad()
def math_eval(engine: Engine, r: Renderer, k: int, seed: int) -> dict:
    """Greedy accuracy, pass@j (j <= k, from k samples per problem), distinct answers, first-token entropy, and
    "tokens": the generated (POLICY) tokens of the greedy pass and of the k samples per problem, in all and per
    sample (the stop token included). "per_problem": each held-out problem's greedy 0/1, right samples (of k) and
    distinct answers, in the held-out order: what a paired comparison of two models on the same problems needs
    (`runs.verdicts.paired`)."""
    tasks = list(heldout_tasks())
    greedy = sample_episodes(source_for(Decoder(engine.sample, answer_settings(greedy=True)), r), tasks, 1, 0)
    trajs = sample_episodes(source_for(Decoder(engine.sample, answer_settings()), r), tasks, k, seed)  # task-major: k samples of task 0 first
    correct = [[t.reward >= 1 for t in trajs[i * k : (i + 1) * k]] for i in range(len(tasks))]
    answers = [[t.info["reply"] if t.info["n_unterminated"] == 0 else None for t in trajs[i * k : (i + 1) * k]]
               for i in range(len(tasks))]
    # the next-token distribution right after the assistant header: the first answer digit
    headed = [r.render([{"role": "user", "content": t.prompt}]) for t in tasks]
    for traj in headed:
        traj.append([r.header_ids["assistant"]], Owner.TEMPLATE, 0)
    batch = collate(headed, r.tokenizer.pad_id)
    last = batch.attention_mask.sum(-1) - 1  # [B] each row's header
    logits = engine.forward(batch, logits=True).logits[torch.arange(batch.size), last][:, None]  # [B, 1, V]
    return {"greedy": sum(t.reward for t in greedy) / len(greedy),
            "pass_at": {str(j): mean_pass_at_k(correct, j) for j in KS if j <= k},
            "distinct": distinct_answers(answers, k),
            "per_problem": {"greedy": [int(t.reward >= 1) for t in greedy], "correct": [sum(c) for c in correct],
                            "distinct": [len(set(a)) for a in answers], "k": k},
            "entropy": float(entropy_from_logits(logits).mean()),
            "tokens": {name: {"total": generated_tokens(ts), "per_sample": generated_tokens(ts) / len(ts)}
                       for name, ts in (("greedy", greedy), ("sampled", trajs))}}


def calc_model(config, tok) -> TinyTransformer:
    return TinyTransformer(TinyConfig(tok.vocab_size, config.calc_dim, config.calc_layers, config.n_heads, max_len=32))


def stage_coldstart(ctx) -> dict:
    """B6, first half: the cold-start SFT calculator."""
    config = ctx.config
    tok = arithmetic_tokenizer()
    r = Renderer(tok)
    torch.manual_seed(config.seed)
    model = calc_model(config, tok)
    engine = ctx.engine(model, config.calc_optim)
    data = demos(r, train_tasks(config.coldstart.steps * config.coldstart.batch_size, seed=config.seed))
    train_sft(engine, data, config.coldstart, tok.pad_id, ctx.run())
    ctx.save_model(model, tok, "model", meta={"stage": ctx.name})
    return {"params": model.num_parameters(), **math_eval(engine, r, config.pass_k, derive(config.seed, 5, stride=7919))}


def stage_grpo(ctx) -> dict:
    """B6, second half: GRPO from the cold start; per-step reward and share of groups without signal
    (rollout/no_signal_share, in every step's row)."""
    config = ctx.config
    model, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    engine = ctx.engine(model, config.rl_optim)
    tasks = train_tasks(config.rl.steps * config.rl.tasks_per_step, seed=config.seed + 1)
    with overlapped(engine, config.sampling, lambda policy: source_for(policy, r),
                    Decoder(engine.sample, answer_settings())) as source:
        history = train_rl(engine, tasks, source, config.rl, tok.pad_id, ctx.run())
    return {**math_eval(engine, r, config.pass_k, derive(config.seed, 5, stride=7919)),
            "curve": [(h["step"], h["rollout/reward"], h["rollout/no_signal_share"]) for h in history]}


def stage_sft_control(ctx) -> dict:
    """B7: the same start, more SFT steps (200) on fresh worked examples instead of RL."""
    config = ctx.config
    model, tok = load_model(ctx.run_dir / "coldstart" / "model")
    r = Renderer(tok)
    engine = ctx.engine(copy.deepcopy(model), config.calc_optim)
    data = demos(r, train_tasks(config.control.steps * config.control.batch_size, seed=config.seed + 2))
    train_sft(engine, data, config.control, tok.pad_id, ctx.run())
    return math_eval(engine, r, config.pass_k, derive(config.seed, 5, stride=7919))
