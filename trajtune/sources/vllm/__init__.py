"""vLLM as the sampler: colocated beside the trainer, or as servers; weights synced and checked after every update.

    runner = vllm_runner(engine, model_dir, sampling)    a colocated engine, or sampling.vllm_server's
    EpisodeSource(runner, make_env, renderer, ...)                the episode loop here, each turn's tokens from vLLM

The episode loop runs in the trainer's process and each turn's sampler call goes to vLLM -- token ids in, token ids
out (no detokenize / retokenize round trip: the ids trained on are the ids vLLM sampled), the transcript's ids as
the prompt of every turn, so vLLM's prefix cache serves the turns of a multi-turn episode. After every optimizer
step the trainer's weights are sent and checked by the one sync check (`trajtune.sources.sync.check_sync`).

When vLLM cannot run the model: what can be known before it starts is checked first (`check_model_runs`: its
CPU build has attention kernels for some head sizes only), one line, before minutes of start-up. Anything else a
colocated engine meets ends in one line too: its engine core and workers write their output to a log file
(`Colocated.log`, named when the engine starts), and an engine that stops is a `SamplerDied` naming the first
error in that log (`first_error`) and the file -- not vLLM's ~200 lines of worker tracebacks.

Modules:

    clients.py   vLLM itself: `Colocated` (a `vllm.LLM` here), `Servers` (`trajtune vllm-serve` over HTTP), the
                 `VLLMEngine` interface they share, `import_vllm`, `check_model_runs`, `first_error`
    sampler.py   `VLLMSampler`: vLLM as a `trajtune.sources.sampler.WeightSampler` (settings fixed when made)
    weights.py   `WeightSync`: the trainer's weights (or LoRA adapter) written, loaded by vLLM, checked
    runner.py    `VLLMRunner` (the episode loop here; rollouts and syncs in order), `vllm_runner`
"""

from .clients import (INSTALL, SERVED_NAME, WORKER_EXTENSION, Colocated, Request, Servers, VLLMEngine,
                      check_model_runs, first_error, import_vllm)
from .runner import VLLMRunner, vllm_runner
from .sampler import VLLMSampler
from .weights import WeightSync

__all__ = ["INSTALL", "SERVED_NAME", "WORKER_EXTENSION", "Colocated", "Request", "Servers", "VLLMEngine", "VLLMRunner",
           "VLLMSampler", "WeightSync", "check_model_runs", "first_error",
           "import_vllm", "vllm_runner"]
