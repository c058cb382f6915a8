"""The sampling routes of the Tinker service: sampling sessions over a model's sampler weights, and `asample`.

A sampling session samples with one of: the sampler weights a training client saved (`save_weights_and_get_sampling_
client`: an unnamed snapshot in memory; `save_weights_for_sampler(name)`: named, on disk, read back after a restart),
a base model untrained (`create_sampling_client(base_model=...)`), or a training state's weights
(`create_sampling_client(model_path="tinker://.../weights/NAME")`, on a copy of the model that only samples).
Sampling runs on one thread of its own, beside the models' training threads: the requests waiting when it is free
(the prompts a client sends together: an RL step's batch) are grouped by model, weights and parameters, and each group
is one call of the sampler (`sampling.SamplerWeights.sample_many`: each request's rows drawn from its own seeded
streams, so a request's samples do not depend on its group). The model's end-of-sequence token always
ends a sample, besides the request's stop tokens and strings (as vLLM does).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .futures import HTTPError, Reply, Result, attempt, failure
from .models import ModelError, ModelSpec, TrainedModel, safe_name

if TYPE_CHECKING:
    from .service import TinkerService


class SamplingRoutes:
    """create_sampling_session, samplers/<id>, asample (module docstring), for `service`."""

    def __init__(self, service: "TinkerService") -> None:
        self.service = service
        self.samplers: dict[str, dict] = {}  # sampling session id -> {"model", "key" (None: base), "model_path"}
        self.gather_s = 0.005
        self._queue: list[_Ask] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tinker-sample", daemon=True)
        self._thread.start()

    def add(self, sid: str, entry: dict) -> None:
        with self.service.lock:
            self.samplers[sid] = entry

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

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

        r = parse_request("asample", body)
        with self.service.lock:
            entry = self.samplers.get(r.sampling_session_id)
        if entry is None:
            raise HTTPError(404, f"no sampling session {r.sampling_session_id} on this server (its weights were in "
                                 "memory only and the server restarted, or it never existed): "
                                 "save_weights_for_sampler(name) keeps sampler weights across restarts")
        model = self.service.model(entry["model"])
        p = r.params
        stop = p.stop or ()
        stop_ids = [int(t) for t in stop if isinstance(t, int)]
        if model.tokenizer.eos_token_id is not None:  # the model's end of sequence always ends a sample (as vLLM)
            stop_ids.append(int(model.tokenizer.eos_token_id))
        rid = self.service.futures.new()
        params = (p.max_tokens, p.temperature, max(p.top_k, 0), p.top_p, tuple(stop_ids),
                  tuple(t for t in stop if isinstance(t, str)))
        with self._cond:
            self._queue.append(_Ask(rid, model, entry["key"], list(r.prompt), r.num_samples, p.seed,
                                    r.prompt_logprobs, params))
            self._cond.notify()
        return Reply.json({"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(r.num_samples)]})

    def _run(self) -> None:
        """The sampling thread: every request queued, grouped by model, weights and parameters, one call per group."""
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            time.sleep(self.gather_s)  # the requests a client sends together (a batch of prompts) arrive together
            with self._cond:
                asks, self._queue = self._queue, []
            groups: dict[tuple, list[_Ask]] = {}
            for ask in asks:
                groups.setdefault((id(ask.model), ask.key, ask.params), []).append(ask)
            for group in groups.values():
                try:
                    self._answer(group)
                except Exception as e:  # noqa: BLE001 - our bug: the group's futures fail, the thread lives on
                    gone = failure(e)
                    for ask in group:
                        self.service.futures.finish(ask.rid, gone)

    def _answer(self, asks: list["_Ask"]) -> None:
        """Sample a group of requests in one call; each request's future gets its own answer or its own error."""
        from .wire import encode_sample_response

        model, key = asks[0].model, asks[0].key
        max_tokens, temperature, top_k, top_p, stop_ids, stop_strings = asks[0].params
        valid = []
        for ask in asks:  # a bad prompt fails its own request, not the group's
            failed = attempt(lambda: model.snapshots.check_request(ask.prompt, max_tokens, ask.n))  # noqa: B023
            if failed.error is not None:
                self.service.futures.finish(ask.rid, failed)
            else:
                valid.append(ask)
        outs: list = []
        failed = attempt(lambda: outs.extend(model.snapshots.sample_many(
            key, [(a.prompt, a.n, a.seed) for a in valid], max_tokens=max_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, stop_ids=stop_ids, stop_strings=stop_strings)))
        for i, ask in enumerate(valid):
            if failed.error is not None:
                self.service.futures.finish(ask.rid, failed)
                continue
            seqs = outs[i]

            def result(ask: _Ask = ask, seqs: list = seqs) -> Result:
                lps = model.snapshots.prompt_logprobs(key, ask.prompt) if ask.prompt_logprobs else None
                return Result(proto=encode_sample_response(seqs, lps),
                              json={"type": "sample", "prompt_logprobs": lps,
                                    "sequences": [{"tokens": t, "logprobs": lp, "stop_reason": "stop" if s else
                                                   "length"} for t, lp, s in seqs]})

            self.service.futures.finish(ask.rid, attempt(result))


@dataclass
class _Ask:
    """One asample request waiting for the sampling thread."""

    rid: str
    model: TrainedModel
    key: str | None
    prompt: list[int]
    n: int
    seed: int | None
    prompt_logprobs: bool
    params: tuple  # (max_tokens, temperature, top_k, top_p, stop ids, stop strings): what a group shares
