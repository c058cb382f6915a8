"""Chapter 13's calculator (REPRODUCE B6, first half), which the recipes doing RL on arithmetic start from.

    coldstart  a tiny "calculator" (dim 64, 2 layers) SFT'd on worked 2-digit additions (`stage_coldstart`)

The arithmetic gym's source (`source_for`, its answers sampled as `answer_sampling` says), the worked
demonstrations (`demos`), the model (`calc_model`).

Evaluation (`math_eval`, the seed's): on the 256 held-out problems, greedy accuracy;
pass@1..16 from 16 samples per problem (unbiased estimator); distinct answers among
the 16 samples; the entropy of the first answer token; and the inference token budget
of the greedy and the sampled passes (RLHF book ch.16: generated tokens, in all and per
sample).
"""

from __future__ import annotations

import dataclasses

import torch

from ...algorithms.sft import train_sft
from ...sources.base import Source
from ...sources.build import episode_source
from ...sources.episodes import sample_episodes
from ...sources.sampling import SamplingConfig
from ...engine import Engine
from ...envs.arithmetic import arithmetic_env, arithmetic_tokenizer, heldout_tasks, train_tasks
from ...evaluation import distinct_answers, generated_tokens, mean_pass_at_k
from ...logprobs import entropy_from_logits
from ...models.tiny import TinyConfig, TinyTransformer
from ...text.render import Renderer
from ...trajectory import Owner, Trajectory, collate
from ...seeding import derive

KS = (1, 2, 4, 8, 16)
MAX_ANSWER = 4  # up to three digits and <|end|>, as the seed's 4 sampled characters


def demos(r: Renderer, tasks) -> list[Trajectory]:
    return [r.render([{"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.answer}])
            for t in tasks]


def answer_sampling(section: SamplingConfig | None = None, **settings) -> SamplingConfig:
    """How an arithmetic answer is sampled, as a sampling section: MAX_ANSWER tokens, each token drawn as
    torch.multinomial draws it (draw race), every completion prefilling its prompt, `settings` (temperature,
    top_p); where the episodes run: `section`'s fields (a run's sampling section; default: here, on-policy)."""
    return dataclasses.replace(section or SamplingConfig(), max_new_tokens=MAX_ANSWER, draw="race",
                               share_prompts=False, **settings)


def source_for(engine: Engine, r: Renderer, sampling: SamplingConfig | None = None, *, greedy: bool = False,
               rl=None) -> Source:
    """The arithmetic gym's episodes of `engine`'s policy (one answer each), sampled as `sampling` says (default
    `answer_sampling()`; `greedy`: the argmax), as a source (`trajtune.sources.build.episode_source`; `rl`: the
    RL loop's config, for an overlapped run). Every draw from one generator, not sharded."""
    return episode_source(sampling or answer_sampling(), engine, arithmetic_env, r, "arithmetic", max_turns=1,
                          max_tokens=32, rl=rl, episode_seeds=False, sharded=False, greedy=greedy)


@torch.no_grad()
def math_eval(engine: Engine, r: Renderer, k: int, seed: int) -> dict:
    """Greedy accuracy, pass@j (j <= k, from k samples per problem), distinct answers, first-token entropy, and
    "tokens": the generated (POLICY) tokens of the greedy pass and of the k samples per problem, in all and per
    sample (the stop token included). "per_problem": each held-out problem's greedy 0/1, right samples (of k) and
    distinct answers, in the held-out order: what a paired comparison of two models on the same problems needs
    (`runs.verdicts.paired`)."""
    tasks = list(heldout_tasks())
    greedy = sample_episodes(source_for(engine, r, greedy=True), tasks, 1, 0)
    trajs = sample_episodes(source_for(engine, r), tasks, k, seed)  # task-major: k samples of task 0 first
    correct = [[t.reward >= 1 for t in trajs[i * k : (i + 1) * k]] for i in range(len(tasks))]
    answers = [[t.info["reply"] if not t.truncated else None for t in trajs[i * k : (i + 1) * k]]
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


COLDSTART_READS = ("seed", "calc_dim", "calc_layers", "n_heads", "coldstart", "calc_optim", "pass_k")
"""the config fields `stage_coldstart` reads (`Stage.reads`)"""


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
    return {"params": model.num_parameters(),
            **math_eval(engine, r, config.pass_k, derive(config.seed, 5, stride=7919))}

