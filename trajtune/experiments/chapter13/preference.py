"""Post-training ch.13 step 3 (REPRODUCE B3-B5): a reward model, best-of-n and DPO on one preference.

The hidden "human" preference: replies that end with a period. Pairs are real corpus
lines for a seen word, one ending with '.', one not (`envs.instruct.preference_pairs`).

    B3  reward_model  Bradley-Terry on the pairs: the SFT(narrow) network with a scalar head
    B4  best_of_n     n = 2, 4, 8 samples of the SFT model, keep the reward model's favourite;
                      KL from the SFT model <= log n - (n-1)/n (analytic)
    B5  dpo           beta = 1.0, 0.3, 0.1 on the same pairs; KL from the SFT model sampled
                      (mean over replies of sum_t log pi/pi_sft), format adherence, and the
                      share of the log-ratio that sits on the last two tokens (last character
                      and <|end|>)

All models start from the narrow SFT model (`experiments.shared.instruct`, as in the seed); the pairs, the SFT
model and the reward-at-KL evaluation are `experiments.shared.preference`'s.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from ...algorithms.best_of_n import best_of_n, best_of_n_kl_bound
from ...algorithms.dpo import train_dpo
from ...algorithms.reward_model import train_reward_model
from ...sources.scoring import pair_accuracy, reward_model_scores
from ...envs.instruct import SEEN, InstructTask, preference_pairs
from ...models.tiny import TinyTransformer
from ...seeding import derive
from ..shared.instruct import corpus, instruct_source
from ..shared.preference import evaluate_policy, rendered_pairs, sft_model


REWARD_MODEL_READS = ("seed", "reward_model", "reward_model_optim", "bon_ns", "bon_repeats", "eval_per_word",
                      "max_reply")
"""the config fields `stage_reward_model` reads (`Stage.reads`)"""
DPO_READS = ("seed", "dpo", "dpo_optim", "eval_per_word", "max_reply")
"""the config fields `stage_dpo` reads"""


def stage_reward_model(ctx) -> dict:
    """B3 + B4: train the Bradley-Terry reward model, then best-of-n with it."""
    config = ctx.config
    tok, _, _, demos = corpus()
    train, test = preference_pairs(demos, seed=config.seed)
    sft = sft_model(ctx.run_dir)
    torch.manual_seed(config.seed)
    rm = TinyTransformer(dataclasses.replace(sft.config, value_head=True))
    rm.load_state_dict(sft.state_dict(), strict=False)  # the SFT network plus a fresh scalar head
    rm_engine = ctx.engine(rm, config.reward_model_optim)
    train_r, test_r = rendered_pairs(train), rendered_pairs(test)
    history = train_reward_model(
        rm_engine, train_r, config.reward_model, tok.pad_id,
        ctx.run(lambda s: {"eval/pair_accuracy": pair_accuracy(rm_engine, test_r, tok.pad_id)}))
    result = {"rm_accuracy": history[-1]["eval/pair_accuracy"], "rm_train_loss": history[-1]["train/loss"],
              "n_train_pairs": len(train), "n_test_pairs": len(test)}

    # B4: the SFT model itself (n = 1), then best-of-n on fresh samples
    policy = ctx.engine(sft)
    base = evaluate_policy(policy, policy, config, seed=derive(config.seed, 3, stride=7919))
    result["sft"] = {k: base[k] for k in ("reward", "format", "n")}
    tasks = [InstructTask(w) for w in SEEN] * config.bon_repeats
    source = instruct_source(policy, "preference", config.max_reply)
    rm_score = lambda trajs: reward_model_scores(rm_engine, trajs, tok.pad_id)  # noqa: E731
    result["best_of_n"] = {}
    for n in config.bon_ns:
        g = torch.Generator().manual_seed(derive(config.seed, 100 + n, stride=7919))
        chosen, _ = best_of_n(tasks, source, n, g, rm_score)
        result["best_of_n"][str(n)] = {
            "reward": sum(t.reward for t in chosen) / len(chosen),
            "format": sum(t.info["format_ok"] for t in chosen) / len(chosen),
            "kl_bound": best_of_n_kl_bound(n), "n": len(chosen)}
    return result


def stage_dpo(ctx, beta: float) -> dict:
    """B5: offline DPO from the SFT model at one beta; reward, KL from SFT, format, end share."""
    config = ctx.config
    tok, _, _, demos = corpus()
    train, _ = preference_pairs(demos, seed=config.seed)
    sft = sft_model(ctx.run_dir)
    ref = ctx.engine(copy.deepcopy(sft))  # for the evaluation's KL (train_dpo keeps its own reference)
    torch.manual_seed(config.seed)
    engine = ctx.engine(sft, config.dpo_optim)
    train_dpo(engine, rendered_pairs(train), dataclasses.replace(config.dpo, beta=beta), tok.pad_id, ctx.run())
    return {"beta": beta, **evaluate_policy(engine, ref, config, seed=derive(config.seed, 4, stride=7919))}
