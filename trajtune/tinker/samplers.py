"""The sampling routes of the Tinker service: sampling sessions over a model's sampler weights, and `asample`.

A sampling session samples with one of: the sampler weights a training client saved (`save_weights_and_get_sampling_
client`: an unnamed snapshot in memory; `save_weights_for_sampler(name)`: named, on disk, read back after a restart),
a base model untrained (`create_sampling_client(base_model=...)`), or a training state's weights
(`create_sampling_client(model_path="tinker://.../weights/NAME")`, on a copy of the model that only samples).
Sampling runs on one thread of its own (`pool`), beside the models' training threads; each request's `num_samples`
continuations are one call of the sampler (`sampling.SamplerWeights.sample`). The model's end-of-sequence token always
ends a sample, besides the request's stop tokens and strings (as vLLM does).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .futures import HTTPError, Reply, Result
from .models import ModelError, ModelSpec, TrainedModel, safe_name

if TYPE_CHECKING:
    from .service import TinkerService


class SamplingRoutes:
    """create_sampling_session, samplers/<id>, asample (module docstring), for `service`."""

    def __init__(self, service: "TinkerService") -> None:
        self.service = service
        self.samplers: dict[str, dict] = {}  # sampling session id -> {"model", "key" (None: base), "model_path"}
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-sample")

    def add(self, sid: str, entry: dict) -> None:
        with self.service.lock:
            self.samplers[sid] = entry

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def create_sampling_session(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request

        r = parse_request("create_sampling_session", body)
        sid = f"{r.session_id}:sampler:{r.sampling_session_seq_id}"
        entry = self._entry(r.model_path, r.base_model)
        with self.service.lock:
            self.samplers[sid] = entry
        return Reply.json({"type": "create_sampling_session", "sampling_session_id": sid})

    def _entry(self, model_path: str | None, base_model: str | None) -> dict:
        """{"model", "key", "model_path"}: what a sampling session samples with -- a base model's weights, named
        sampler weights (read from their file after a restart), or a training state's weights."""
        if model_path is None:
            assert base_model is not None
            model_id = f"base:{base_model}"
            self._only_sampled(model_id, lambda: self.service.new_model(ModelSpec(model_id, base_model, lora_rank=0)))
            return {"model": model_id, "key": None, "model_path": None}
        from .requests import parse_tinker_path

        run, kind, name = parse_tinker_path(model_path, "create_sampling_session", "model_path")
        if kind == "weights":  # a training state: its weights on a sampling-only copy of the model
            folder = self.service.home / "checkpoints" / safe_name(run) / "weights" / name
            source = self.service.registry.model(run)
            if source is None or not (folder / "engine.json").exists():
                raise HTTPError(404, f"no checkpoint {model_path} on this server")
            model_id = f"state:{model_path}"

            def make() -> TrainedModel:
                model = self.service.new_model(replace(ModelSpec(**source["spec"]), model_id=model_id))
                model.load_state(folder, optimizer=False)
                model.snapshots.save(name, [], named=True)
                return model

            self._only_sampled(model_id, make)
            return {"model": model_id, "key": name, "model_path": model_path}
        entry = self.service.registry.sampler(model_path)
        if entry is None:
            raise HTTPError(404, f"no sampler weights {model_path} on this server (save_weights_for_sampler(name) "
                                 "makes them)")
        model = self.service.model(entry["model"])
        if entry["key"] not in model.snapshots.keys():
            model.snapshots.read(entry["key"], Path(entry["file"]))
        return {"model": entry["model"], "key": entry["key"], "model_path": model_path}

    def _only_sampled(self, model_id: str, make: Callable[[], TrainedModel]) -> None:
        """A model only sampled from (a base model, a training state), made once."""
        with self.service.lock:
            lock = self.service.loading.setdefault(model_id, threading.Lock())
        with lock:
            if model_id in self.service.models:
                return
            try:
                model = make()
            except ModelError as e:
                raise HTTPError(400, str(e)) from None
            with self.service.lock:
                self.service.models[model_id] = model

    def get_sampler(self, sid: str) -> Reply:
        with self.service.lock:
            entry = self.samplers.get(sid)
        if entry is None:
            raise HTTPError(404, f"no sampling session {sid} on this server")
        model = self.service.model(entry["model"])
        return Reply.json({"sampler_id": sid, "base_model": model.spec.base_model,
                           "model_path": entry.get("model_path")})

    def asample(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request
        from .wire import encode_sample_response

        r = parse_request("asample", body)
        with self.service.lock:
            entry = self.samplers.get(r.sampling_session_id)
        if entry is None:
            raise HTTPError(404, f"no sampling session {r.sampling_session_id} on this server (its weights were in "
                                 "memory only and the server restarted, or it never existed): "
                                 "save_weights_for_sampler(name) keeps sampler weights across restarts")
        model = self.service.model(entry["model"])
        key, p = entry["key"], r.params
        stop = p.stop or ()
        stop_ids = [int(t) for t in stop if isinstance(t, int)]
        stop_strings = [t for t in stop if isinstance(t, str)]
        if model.tokenizer.eos_token_id is not None:  # the model's end of sequence always ends a sample (as vLLM)
            stop_ids.append(int(model.tokenizer.eos_token_id))

        def work() -> Result:
            seqs = model.snapshots.sample(key, r.prompt, r.num_samples, max_tokens=p.max_tokens,
                                          temperature=p.temperature, top_k=max(p.top_k, 0), top_p=p.top_p,
                                          stop_ids=stop_ids, stop_strings=stop_strings, seed=p.seed)
            prompt_lps = model.snapshots.prompt_logprobs(key, r.prompt) if r.prompt_logprobs else None
            return Result(proto=encode_sample_response(seqs, prompt_lps),
                          json={"type": "sample", "sequences": [{"tokens": t, "logprobs": lp,
                                                                 "stop_reason": "stop" if s else "length"}
                                                                for t, lp, s in seqs],
                                "prompt_logprobs": prompt_lps})

        reply = self.service.submit(work, pool=self.pool)
        rid = json.loads(reply.body)["request_id"]
        return Reply.json({"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(r.num_samples)]})
