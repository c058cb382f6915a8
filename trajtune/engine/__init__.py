"""The engine: the one seam between algorithm loops and the hardware.

Algorithm loops never touch the model, the optimizer or the device directly; they call the `Engine`
protocol, so the same loop runs on a laptop CPU and under `torchrun`. There is one implementation,
`TorchEngine`, with a pluggable collective strategy (one process, DDP or FSDP2) that owns what differs
between them -- which rows a process computes, gathering outputs, reducing metrics, the gradient scale,
full-state save/load, copying weights. Build engines with `make_engine(model, optim)`: it picks the
strategy from how the process was launched.

    engine.forward(batch)                    -> ForwardOutput (no gradient)
    engine.forward_backward(batch, loss)     -> metrics (gradients accumulate)
    engine.optim_step()                      -> metrics (clip, step, zero grads; skips non-finite steps)
    engine.sample(prompts, max_new_tokens, generator, backend="sampler" | "generate", ...) -> Samples
    engine.save_state(dir) / engine.load_state(dir)
    engine.reference_engine()                -> a frozen engine on the current policy (KL / DPO reference)
    engine.copy_weights_from(other)          this engine's weights := other's (a lagged copy: iw-SFT's q)

A `Loss` is a pure function `fn(out: ForwardOutput, batch: Batch) -> (scalar, metrics)`
plus its normaliser (token / sequence / constant). Everything a loss reads beyond
the forward output travels on the batch (`Batch.pg`, `Batch.extras`), so the engine may split a
batch any way it likes -- length buckets, micro-batches, rank shards, all by the one
splitter in `trajtune.trajectory`, never separating rows that share `Batch.together`
(a DPO pair) -- and weight each part by its share of the whole batch's normaliser,
so the accumulated gradient equals the one-piece gradient:

    token:              share = POLICY tokens in the part / POLICY tokens in the batch
    sequence, constant: share = rows in the part / rows in the batch

Under N processes every rank holds the same global batch (step s's data is a function
of (seed, s)); each computes its shard's rows with weight share * N, which DDP / FSDP2's
gradient average (1/N sum) turns back into the one-process gradient; metrics are the
same share-weighted sums, reduced across ranks.

The modules (algorithm loops import from this package only; tests/unit/test_layout.py keeps them out of the rest):

    protocol.py       the contracts: Engine, Collective, Layout; Loss, ForwardOutput, Positions, NonFiniteError, Backend
    torch_engine.py   TorchEngine (the Engine), make_engine, set_mode, nonfinite_rows
    optim.py          OptimConfig: AdamW, warm-up and decay
    collectives.py    the Collectives side by side (SingleProcess, DDP, FSDP), the Layouts (Whole, Sharded)
    distributed.py    the process group (init_distributed, is_main, barrier, ...), Ranks, sharded lists
    decoding.py       the batched KV-cached sampler (backend "sampler")
    generate.py       Hugging Face `generate` as a decoder (backend "generate")
"""

from .optim import OptimConfig
from .protocol import (POSITIONS, Backend, Collective, Engine, ForwardOutput, Layout, Loss, LossFn, NonFiniteError,
                       Positions)
from .torch_engine import (AUTOCAST_DTYPES, DECODERS, HEAD_POSITIONS, TorchEngine, make_engine, nonfinite_rows,
                           set_mode)

__all__ = ["AUTOCAST_DTYPES", "Backend", "Collective", "DECODERS", "Engine", "ForwardOutput", "HEAD_POSITIONS",
           "Layout", "Loss", "LossFn", "NonFiniteError", "OptimConfig", "POSITIONS", "Positions", "TorchEngine",
           "make_engine", "nonfinite_rows", "set_mode"]
