"""`TinkerService`: the Tinker training API over trajtune's engine, as one function from a request to a reply.

    service = TinkerService("runs/tinker")                     # the home: registry, base models, checkpoints
    reply = service.handle("POST", "/api/v1/create_session", headers, body)    # -> Reply(status, body, content_type)

The HTTP server (`server.py`) and the in-process transport (`local.py`) both call `handle`, so the two modes are the
same code. What each route does is the `tinker` client's contract (docs/tinker.md):

* bootstrap: client/config (the client's feature flags: httpx transport, fwd/bwd chunks in order, no compression),
  create_session, session_heartbeat, telemetry, sessions/<id>/finish, healthz, get_server_capabilities;
* training (futures, run by the model's `Sequencer` in `seq_id` order): create_model, forward_backward (protobuf in
  and out; `forward_only` is `forward`), optim_step, save_weights (save_state), save_weights_for_sampler, load_weights
  (a new model from a state, or the deprecated in-place load); get_info answers at once;
* sampling (futures, on a sampling thread): asample (sample and compute_logprobs), create_sampling_session,
  samplers/<id>;
* retrieve_future: long-polls a future for up to `poll_s` seconds, then answers try_again (the client asks again).

A bad request is refused at submit with HTTP 400 and the field named (the client raises `tinker.BadRequestError`);
one that fails while it runs is a failed future (`tinker.RequestFailedError`, category "user" for the request's
fault, "server" for ours, with the traceback in the server's log). No request can stop the server.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .futures import Futures, HTTPError, Reply, Restored, Result, attempt, field_of, json_body
from .models import TINY, ModelError, ModelSpec, TrainedModel, safe_name
from .registry import Registry
from .samplers import SamplingRoutes
from .wire import WireError

log = logging.getLogger("trajtune.tinker")

PREFIX = "/api/v1/"

CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "parallel_fwdbwd_chunks": False,
                 "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False,
                 "sample_join_sampling_session": False, "custom_loss_server_side": False}
"""client/config: the client's feature flags (the httpx transport, so the in-process mode reaches every request;
a large forward_backward's chunks sent in order; no zstd; none of the server-side extensions trajtune lacks)"""


class TinkerService:
    """The Tinker API over trajtune (module docstring). `home`: the folder of its registry and checkpoints; `device`:
    where models train; `sampler`: "own" (trajtune's sampler on a copy of the weights) or "vllm"; `tolerance`: the
    sync check's largest sampler-trainer log-prob difference (nats); `poll_s`: how long retrieve_future waits."""

    def __init__(self, home: str | Path, *, device: str = "cpu", sampler: str = "own", tolerance: float = 1e-3,
                 poll_s: float = 20.0) -> None:
        self.home = Path(home)
        self.device, self.sampler, self.tolerance, self.poll_s = device, sampler, tolerance, poll_s
        self.registry = Registry(self.home / "tinker.json")
        self.futures = Futures(boot=f"b{self.registry.boot}")
        self.models: dict[str, TrainedModel] = {}
        self._restored: dict[str, str] = {}  # model id -> the message its next training request fails with
        self.lock = threading.RLock()
        self.loading: dict[str, threading.Lock] = {}
        self._work = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tinker-load")  # create / load models
        self.sampling = SamplingRoutes(self)
        self._counter = 0
        self.closed = False
        self.routes: dict[tuple[str, str], Callable[[dict, Any], Reply]] = {
            ("POST", "client/config"): lambda h, b: Reply.json(CLIENT_CONFIG),
            ("POST", "client/dynamic_config"): lambda h, b: Reply.json({}),
            ("GET", "healthz"): lambda h, b: Reply.json({"status": "ok"}),
            ("GET", "get_server_capabilities"): self.capabilities,
            ("POST", "telemetry"): lambda h, b: Reply.json({"status": "accepted"}),
            ("POST", "create_session"): self.create_session,
            ("POST", "session_heartbeat"): self.heartbeat,
            ("POST", "create_model"): self.create_model,
            ("POST", "get_info"): self.get_info,
            ("POST", "forward_backward"): self.forward_backward,
            ("POST", "optim_step"): self.optim_step,
            ("POST", "save_weights"): self.save_weights,
            ("POST", "save_weights_for_sampler"): self.save_weights_for_sampler,
            ("POST", "load_weights"): self.load_weights,
            ("POST", "create_sampling_session"): self.sampling.create_sampling_session,
            ("POST", "asample"): self.sampling.asample,
            ("POST", "retrieve_future"): self.retrieve_future,
        }

    # --- the one entry point --------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        """One request -> its reply; never raises."""
        route = path.split("?", 1)[0]
        route = route[len(PREFIX):] if route.startswith(PREFIX) else route.lstrip("/")
        headers = {k.lower(): v for k, v in headers.items()}
        if self.closed:
            return Reply.json({"detail": "the Tinker server is stopping"}, 503)  # the client retries: a restart
        try:
            if method == "POST" and route.startswith("sessions/") and route.endswith("/finish"):
                return self.finish_session(route.split("/")[1], json_body(body))
            if method == "GET" and route.startswith("samplers/"):
                return self.sampling.get_sampler(route.split("/", 1)[1])
            handler = self.routes.get((method, route))
            if handler is None:
                raise HTTPError(404, f"trajtune's Tinker server does not serve {method} {path} (what it serves and "
                                     "what it refuses: docs/tinker.md)")
            return handler(headers, body if route == "forward_backward" else json_body(body))
        except HTTPError as e:
            return Reply.json({"detail": str(e)}, e.status)
        except WireError as e:  # Unsupported included: the request names a feature trajtune refuses
            return Reply.json({"detail": str(e)}, 400)
        except Exception as e:  # noqa: BLE001 - our bug: the client gets a 500, the server stays up
            log.exception("tinker: %s %s failed", method, path)
            return Reply.json({"detail": f"internal error: {type(e).__name__}: {e}"}, 500)

    def close(self) -> None:
        self.closed = True
        for model in list(self.models.values()):
            model.close()
        self._work.shutdown(wait=False, cancel_futures=True)
        self.sampling.close()

    # --- futures --------------------------------------------------------------------------------------------
    def submit(self, work: Callable[[], Result], *, model: TrainedModel | None = None, seq_id: int | None = None,
                pool: ThreadPoolExecutor | None = None, **extra: Any) -> Reply:
        """Run `work` as a future -> the submit reply {"request_id", **extra}. On a model: in its seq_id order."""
        rid = self.futures.new()

        def run() -> None:
            self.futures.finish(rid, attempt(work))

        if model is not None:
            try:
                model.sequencer.submit(seq_id, run)
            except ValueError as e:
                raise HTTPError(409, f"model {model.spec.model_id}: {e}") from None
        else:
            (pool or self._work).submit(run)
        return Reply.json({"request_id": rid, **extra})

    def retrieve_future(self, headers: dict, body: dict) -> Reply:
        rid = field_of(body, "request_id", str)
        try:
            result = self.futures.wait(rid, self.poll_s)
        except KeyError as e:
            return Reply.json({"error": e.args[0], "category": "user"})
        if result is None:
            return Reply.json({"type": "try_again", "request_id": rid, "queue_state": "active"})
        if result.error is not None:
            return Reply.json({"error": result.error, "category": result.category})
        if result.proto is not None:
            if "protobuf" in headers.get("accept", ""):
                return Reply(200, result.proto, "application/x-protobuf")
            return Reply.json(result.json)  # the same result as JSON, for a client that does not read protobuf
        return Reply.json(result.json)

    # --- sessions -------------------------------------------------------------------------------------------
    def create_session(self, headers: dict, body: dict) -> Reply:
        sid = f"s{uuid.uuid4().hex[:10]}"
        self.registry.add_session(sid, {"tags": body.get("tags") or [], "sdk_version": body.get("sdk_version")})
        return Reply.json({"type": "create_session", "session_id": sid})

    def heartbeat(self, headers: dict, body: dict) -> Reply:
        sid = field_of(body, "session_id", str)
        if self.registry.session(sid) is None:
            raise HTTPError(404, f"no session {sid} on this server")
        return Reply.json({"type": "session_heartbeat"})

    def finish_session(self, sid: str, body: dict) -> Reply:
        """The client closed: its models leave memory (their saved states stay; a later request restores them)."""
        reason = str((body.get("reason") or {}).get("type", "")) if isinstance(body.get("reason"), dict) else ""
        for model_id in self.registry.finish_session(sid, reason):
            with self.lock:
                model = self.models.pop(model_id, None)
            if model is not None:
                model.close()
        return Reply.json({})

    def capabilities(self, headers: dict, body: Any) -> Reply:
        from ..models.hub import CATALOG

        names = list(TINY) + list(CATALOG)
        return Reply.json({"supported_models": [{"model_name": n, "trainable": True, "sampleable": True}
                                                for n in names]})

    # --- models ---------------------------------------------------------------------------------------------
    def new_model(self, spec: ModelSpec) -> TrainedModel:
        return TrainedModel(spec, self.home, device=self.device, sampler=self.sampler, tolerance=self.tolerance)

    def model(self, model_id: str) -> TrainedModel:
        """The model `model_id`, restored from the registry after a restart (from its last saved state)."""
        with self.lock:
            if model_id in self.models:
                return self.models[model_id]
            lock = self.loading.setdefault(model_id, threading.Lock())
        with lock:
            with self.lock:
                if model_id in self.models:
                    return self.models[model_id]
            entry = self.registry.model(model_id)
            if entry is None:
                raise HTTPError(404, f"no model {model_id} on this server (create it with "
                                     "create_lora_training_client, or load a checkpoint)")
            model = self.new_model(ModelSpec(**entry["spec"]))
            state = entry.get("state")
            if state is not None:
                model.engine.load_state(state["dir"])
            lost = int(entry["step"]) - model.engine.step
            if lost > 0:
                where = f"its last saved state {state['path']}" if state else "its base model (it was never saved)"
                self._restored[model_id] = (
                    f"the server restarted: model {model_id} was restored from {where} at optimizer step "
                    f"{model.engine.step}; the {lost} step(s) after it were lost. Continue from there with "
                    "create_training_client_from_state_with_optimizer(path), or call again to train on from here")
                self.registry.set_step(model_id, model.engine.step)
            with self.lock:
                self.models[model_id] = model
            return model

    def _training(self, model: TrainedModel) -> None:
        """Raise, once, what a restore after a restart lost (`model`)."""
        message = self._restored.pop(model.spec.model_id, None)
        if message is not None:
            raise Restored(message)

    def create_model(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request

        r = parse_request("create_model", body)
        if self.registry.session(r.session_id) is None:
            raise HTTPError(404, f"no session {r.session_id} on this server")
        model_id = f"{r.session_id}:train:{r.model_seq_id}"
        if self.registry.model(model_id) is not None:
            raise HTTPError(409, f"model {model_id} exists (model_seq_id {r.model_seq_id} was used in this session)")
        lora = r.lora
        spec = ModelSpec(model_id, r.base_model, lora.rank, lora.train_mlp, lora.train_attn, lora.train_unembed,
                         lora.seed if lora.seed is not None else 0)

        def work() -> Result:
            model = self.new_model(spec)
            with self.lock:
                self.models[model_id] = model
            self.registry.add_model(spec.to_json())
            return Result(json={"type": "create_model", "model_id": model_id})

        return self.submit(work, model_id=model_id)

    def get_info(self, headers: dict, body: dict) -> Reply:
        model_id = field_of(body, "model_id", str)
        model = self.model(model_id)
        spec = model.spec
        arch = getattr(getattr(model.engine.model, "base_config", None), "model_type", None)
        return Reply.json({"type": "get_info", "model_id": model_id, "model_name": spec.base_model,
                           "model_data": {"arch": arch, "model_name": spec.base_model,
                                          "tokenizer_id": str(model.folder.resolve())},
                           "optimizer_config": {"type": "adamw"}, "is_lora": spec.lora_rank > 0,
                           "lora_rank": spec.lora_rank})

    # --- training -------------------------------------------------------------------------------------------
    def forward_backward(self, headers: dict, body: bytes) -> Reply:
        from .losses import forward_backward
        from .wire import decode_forward_backward, encode_forward_backward_output

        req = decode_forward_backward(body, headers.get("content-encoding"))
        model = self.model(req.model_id)

        def work() -> Result:
            self._training(model)
            outputs, metrics = forward_backward(model.engine, req.data, req.loss_fn, req.loss_fn_config,
                                                req.forward_only, model.vocab, context=model.context or None)
            if not req.forward_only:
                model.probe = [list(d.tokens) for d in req.data[:2]]
            kind = f"{req.loss_fn}_output"
            return Result(proto=encode_forward_backward_output(outputs, metrics, kind),
                          json=_output_json(outputs, metrics, kind))

        return self.submit(work, model=model, seq_id=req.seq_id, model_id=req.model_id)

    def optim_step(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request

        r = parse_request("optim_step", body)
        model = self.model(r.model_id)

        def work() -> Result:
            self._training(model)
            engine = model.engine
            a = r.adam
            engine.optim_config = replace(engine.optim_config, beta1=a.beta1, beta2=a.beta2, eps=a.eps,
                                          weight_decay=a.weight_decay, grad_clip=a.grad_clip_norm)
            m = engine.optim_step(lr=a.learning_rate)
            self.registry.set_step(r.model_id, engine.step)
            return Result(json={"type": "optim_step", "metrics": {"grad_norm:mean": m["grad_norm"],
                                                                  "learning_rate:mean": m["lr"],
                                                                  "skipped:sum": m["skipped"]}})

        return self.submit(work, model=model, seq_id=r.seq_id, model_id=r.model_id)

    def save_weights(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request

        r = parse_request("save_weights", body)
        model = self.model(r.model_id)
        name = r.path or f"step-{model.engine.step:06d}"

        def work() -> Result:
            folder = model.checkpoints / "weights" / name
            if folder.exists() and not r.overwrite:
                raise ModelError(f"checkpoint {name!r} of {r.model_id} exists (overwrite=True replaces it)")
            folder.parent.mkdir(parents=True, exist_ok=True)
            model.engine.save_state(folder, extra={"spec": model.spec.to_json()})
            path = f"tinker://{r.model_id}/weights/{name}"
            self.registry.set_state(r.model_id, {"path": path, "dir": str(folder), "step": model.engine.step})
            return Result(json={"type": "save_weights", "path": path})

        return self.submit(work, model=model, seq_id=r.seq_id, model_id=r.model_id)

    def save_weights_for_sampler(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request

        r = parse_request("save_weights_for_sampler", body)
        model = self.model(r.model_id)

        def work() -> Result:
            if r.path is None:  # save_weights_and_get_sampling_client: a sampling session on a snapshot in memory
                with self.lock:
                    self._counter += 1
                    sid = f"{r.model_id}:sample:{self._counter}"
                model.snapshots.save(sid, model.probe)
                self.sampling.add(sid, {"model": r.model_id, "key": sid, "model_path": None})
                return Result(json={"type": "save_weights_for_sampler", "sampling_session_id": sid})
            file = model.checkpoints / "sampler_weights" / r.path
            model.snapshots.save(r.path, model.probe, named=True)
            file.parent.mkdir(parents=True, exist_ok=True)
            model.snapshots.write(r.path, file)
            path = f"tinker://{r.model_id}/sampler_weights/{r.path}"
            self.registry.add_sampler(path, {"model": r.model_id, "key": r.path, "file": str(file)})
            return Result(json={"type": "save_weights_for_sampler", "path": path})

        return self.submit(work, model=model, seq_id=r.seq_id, model_id=r.model_id)

    def load_weights(self, headers: dict, body: dict) -> Reply:
        from .requests import parse_request

        r = parse_request("load_weights", body)
        run, name = r.checkpoint.training_run_id, r.checkpoint.name
        source = self.registry.model(run)
        folder = self.home / "checkpoints" / safe_name(run) / "weights" / name
        if source is None or not (folder / "engine.json").exists():
            raise HTTPError(404, f"load_weights: no checkpoint {r.path} on this server")
        if r.model_id is not None:  # the deprecated in-place load into an existing model
            model = self.model(r.model_id)

            def load_here() -> Result:
                model.load_state(folder, r.optimizer)
                self.registry.set_step(model.spec.model_id, model.engine.step)
                return Result(json={"type": "load_weights", "path": r.path, "model_id": r.model_id})

            return self.submit(load_here, model=model, seq_id=r.seq_id, model_id=r.model_id)
        model_id = f"{r.session_id}:train:{r.model_seq_id}"
        if self.registry.model(model_id) is not None:
            raise HTTPError(409, f"model {model_id} exists (model_seq_id {r.model_seq_id} was used in this session)")
        spec = replace(ModelSpec(**source["spec"]), model_id=model_id)

        def work() -> Result:
            model = self.new_model(spec)
            model.load_state(folder, r.optimizer)
            with self.lock:
                self.models[model_id] = model
            self.registry.add_model(spec.to_json(), step=model.engine.step)
            return Result(json={"type": "load_weights", "path": r.path, "model_id": model_id})

        return self.submit(work, model_id=model_id)

def _output_json(outputs: list[dict], metrics: dict[str, float], kind: str) -> dict:
    """A forward_backward result as the protocol's JSON (TensorData per output), for clients that do not read
    protobuf (curl, older SDKs); the tinker 0.38 client asks for the protobuf."""
    def tensor(a) -> dict:
        return {"data": a.reshape(-1).tolist(), "dtype": "int64" if a.dtype.kind in "iu" else "float32",
                "shape": list(a.shape)}

    return {"loss_fn_output_type": kind, "loss_fn_outputs": [{k: tensor(v) for k, v in o.items()} for o in outputs],
            "metrics": metrics}
