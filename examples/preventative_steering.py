"""Fine-tune without learning a trait: preventative steering (RLHF book ch.17.2, persona vectors) on a tiny model.

    python examples/preventative_steering.py      # ~5 CPU-s; the trait's shift in the activations, without / with

The "trait" is a habit in the fine-tuning data: every reply is a run of b's where the model's neutral reply is a
run of a's. `trajtune.models.steering` reads the residual stream after a block: the persona vector v is the mean
activation over trait replies minus that over neutral ones (`persona_vector`, Chen et al.). SFT on the trait data
moves the model's activations along v (the trait enters the weights); with `preventative_steering` -- the
residual pushed along v by alpha in the training forwards only, so the update need not move it there itself --
the same SFT moves them less than half as far, while the loss still falls (seed 0, alpha 3 on the unit vector, 30
steps: +3.57 without, +0.73 with; loss 2.69 -> 0.43 and 2.58 -> 0.40). Sampling and evaluation run unsteered.
Then the data screen of ch.17.2e: the projection difference of each training reply against the base model's own
(`projection_difference`) flags the trait samples of a mixed set (`screen_by_projection`).
"""

from __future__ import annotations

import argparse

import torch

from trajtune.algorithms.sft import SFTConfig, train_sft
from trajtune.engine import OptimConfig, make_engine
from trajtune.models.steering import (persona_vector, preventative_steering, projection, projection_difference,
                                      response_activations, screen_by_projection)
from trajtune.models.tiny import TinyConfig, TinyTransformer
from trajtune.text.render import Renderer
from trajtune.text.tokenizers import CharTokenizer
from trajtune.trajectory import Owner, collate

TOK = CharTokenizer.from_corpus("Q: pickab")
RENDER = Renderer(TOK)


def demo(reply: str):
    return RENDER.render([{"role": "user", "content": "Q: pick"}, {"role": "assistant", "content": reply}])


TRAIT = [demo("b" * k) for k in (1, 2, 3, 4)]
NEUTRAL = [demo("a" * k) for k in (1, 2, 3, 4)]


def model(seed: int):
    torch.manual_seed(seed)
    return make_engine(TinyTransformer(TinyConfig(TOK.vocab_size, dim=32, n_layers=1, n_heads=2, max_len=32)),
                       OptimConfig(lr=1e-2))


def acts(net, trajs, layer: int = 0) -> torch.Tensor:
    """[N, D]: each episode's mean residual activation after block `layer` over its reply (POLICY) tokens."""
    batch = collate(trajs, TOK.pad_id)
    mask = torch.tensor([[int(o == Owner.POLICY) for o in t.owners] + [0] * (batch.ids.shape[1] - len(t))
                         for t in trajs])
    return response_activations(net, batch.ids, mask, layer)


def main(seed: int = 0, alpha: float = 3.0, steps: int = 30, verbose: bool = True) -> dict:
    shifts, losses = {}, {}
    for a in (0.0, alpha):
        e = model(seed)
        v = persona_vector(acts(e.model, TRAIT), acts(e.model, NEUTRAL))  # mean b-reply minus mean a-reply
        before = projection(acts(e.model, NEUTRAL + TRAIT), v).mean().item()
        with preventative_steering(e.model, 0, v / v.norm(), a):
            history = train_sft(e, TRAIT * 2, SFTConfig(steps=steps, batch_size=8), TOK.pad_id)
        shifts[a] = projection(acts(e.model, NEUTRAL + TRAIT), v).mean().item() - before
        losses[a] = (history[0]["train/loss"], history[-1]["train/loss"])
    e = model(seed)
    v = persona_vector(acts(e.model, TRAIT), acts(e.model, NEUTRAL))
    mixed = [TRAIT[0], NEUTRAL[1], TRAIT[2], NEUTRAL[3]]
    diff = projection_difference(acts(e.model, mixed), acts(e.model, NEUTRAL), v)
    kept = screen_by_projection(diff, threshold=0.5 * diff.max().item()).tolist()
    if verbose:
        for a in shifts:
            print(f"alpha {a:g}: SFT loss {losses[a][0]:.2f} -> {losses[a][1]:.2f}; activations moved "
                  f"{shifts[a]:+.2f} along the trait direction")
        print(f"screen of a mixed set (trait, neutral, trait, neutral): kept {kept}")
    return {"shifts": shifts, "losses": losses, "kept": kept}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=3.0)
    args = ap.parse_args()
    main(args.seed, args.alpha)
