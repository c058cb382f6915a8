"""Chapter 13's preference pieces the recipes on its instruct policy share: the pairs rendered as conversations,
the narrow SFT model (`sft_narrow`'s checkpoint) and the reward-at-KL evaluation of a policy.

The hidden "human" preference: replies that end with a period (`envs.instruct.preference_pairs`). chapter13's
own B3-B5 stages (reward model, best-of-n, DPO) are `experiments.chapter13.preference`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...sources.episodes import sample_episodes
from ...engine import Engine
from ...envs.instruct import SEEN, InstructTask
from ...models.tiny import TinyTransformer, load_model
from ...runs.verdicts import ratio
from ...trajectory import collate
from .instruct import corpus, demo, instruct_source, renderer


def rendered_pairs(pairs):
    r = renderer()
    return [(demo(r, task, chosen), demo(r, task, rejected)) for task, chosen, rejected in pairs]


def sft_model(run_dir: Path) -> TinyTransformer:
    return load_model(Path(run_dir) / "sft_narrow" / "model")[0]


@torch.no_grad()
def evaluate_policy(policy: Engine, ref: Engine, config, seed: int) -> dict:
    """Sample `eval_per_word` replies per seen word: true reward, format, sampled KL from ref, end share, and the
    noise of each (`n` replies; `kl_se` the standard error of the mean KL; `end_share_se` the delta-method SE of the
    ratio over replies, `runs.verdicts.ratio`: a bootstrap of it followed the float path when the log-ratio sum
    nears 0)."""
    pad = corpus()[0].pad_id
    trajs = sample_episodes(instruct_source(policy, "preference", config.max_reply), [InstructTask(w) for w in SEEN],
                            config.eval_per_word, seed)
    batch = collate(trajs, pad)
    mask = batch.action_mask  # [B, T-1] the reply's characters and its <|end|>
    log_ratio = (policy.forward(batch).logprobs - ref.forward(batch).logprobs) * mask  # [B, T-1]
    position = torch.arange(mask.shape[1]).expand_as(mask)
    last = (position * mask).amax(-1, keepdim=True)  # [B, 1] index of each reply's last POLICY token
    tail = mask * (position >= last - 1)  # the last two POLICY tokens of each reply
    per_reply = log_ratio.sum(-1)  # [B]
    n = len(trajs)
    share = ratio((log_ratio * tail).sum(-1).tolist(), per_reply.tolist())  # nan for the reference itself
    return {"reward": sum(t.reward for t in trajs) / n, "n": n,
            "format": sum(t.info["format_ok"] for t in trajs) / n,
            "kl": float(per_reply.mean()), "kl_se": float(per_reply.std() / n ** 0.5) if n > 1 else 0.0,
            "end_share": share.value, "end_share_se": share.se,
            "examples": [t.info["reply"] for t in trajs[:: config.eval_per_word][:3]]}

