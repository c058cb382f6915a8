"""The JSON side of the Tinker protocol: every JSON route body the server answers, parsed into a frozen dataclass with
each field checked (type, range). A bad field raises `WireError` naming it ("optim_step: adam_params.learning_rate must
be a finite number >= 0, got -1"); a feature trajtune refuses raises `Unsupported` (both from trajtune.tinker.wire;
the service answers HTTP 400 {"detail": str(e)}). Fields a body carries that are not read here are ignored: the client
adds fields over versions; those that ask for a refused feature are read, and refused.

    parse_request("optim_step", body) -> OptimStep(model_id=..., seq_id=..., adam=AdamParams(...))
    parse_tinker_path("tinker://S:train:0/weights/ckpt1") -> TinkerPath("S:train:0", "weights", "ckpt1")
    REFUSED: (feature, reason) for every refusal here, the docs page's list

JSON `null` reads as absent (the client drops None fields: `model_dump(exclude_none=True)`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from trajtune.tinker.wire import NO_STABILITY, TEXT_ONLY, Unsupported, WireError

_LOGPROBS = "trajtune returns the sampled tokens' log-probs and the prompt's, not top-k or alternatives"
IMAGES = "image chunks (ImageChunk, ImageAssetPointerChunk) in a prompt or datum"
AUDIO = "audio chunks (DmelChunk)"
SPANS = "provenance spans (Datum.with_provenance)"
STABILITY = "sample(record_stability_info=True)"
DIMUON = "DimuonOptimizerConfig / DimuonParams (any optimizer but AdamW)"
INFLIGHT = "save_weights_for_sampler kind='inflight'"
TOPK = "sample(topk_prompt_logprobs>0, topk_sample_logprobs>0)"
ALT_TOKENS = "sample(prompt_alt_tokens_k>0)"
TARGET = "sample(target_prompt_logprobs=...)"
LAST_N = "sample(prompt_logprobs_last_n=...)"
REFUSED_LOSSES = {
    "stable_reinforce": "it needs the stability data a Tinker server records while sampling "
                        "(record_stability_info, provenance spans); trajtune's sampler records none: use "
                        "importance_sampling, ppo, cispo or gspo",
    "custom": "server-side custom losses (create_custom_loss) run code traced on the server; use "
              "forward_backward_custom, which needs only cross_entropy",
}
"""Tinker's losses trajtune refuses -> why (`losses.loss_spec` raises them)."""
REFUSED: list[tuple[str, str]] = [
    *((f"forward_backward(loss_fn={name!r})", why) for name, why in REFUSED_LOSSES.items()),
    (IMAGES, TEXT_ONLY), (AUDIO, TEXT_ONLY), (SPANS, NO_STABILITY), (STABILITY, NO_STABILITY),
    (DIMUON, "trajtune's engine trains with AdamW"),
    (INFLIGHT, "trajtune's sampler weights are snapshots, each checked against the trainer's log-probs when saved; "
     "use the default kind 'snapshot'"),
    (TOPK, _LOGPROBS), (ALT_TOKENS, _LOGPROBS), (TARGET, _LOGPROBS),
    (LAST_N, "prompt log-probs are computed for the whole prompt; slice them"),
]
_REASONS = dict(REFUSED)
_MISSING: Any = object()
_INT64 = 2**63 - 1
MAX_TOKEN_ID = 2**31 - 1  # tokens travel as int32 in the protobuf messages


def _show(value: object) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Fields:
    """One JSON object of a route's body, read field by field; errors name `route: prefix.key`."""

    def __init__(self, route: str, body: object, prefix: str = ""):
        if not isinstance(body, dict):
            raise WireError(f"{route}: {prefix or 'the body'} must be a JSON object, got {_show(body)}")
        self.route, self.body, self.prefix = route, body, prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, must: str, value: object = _MISSING) -> WireError:
        got = "" if value is _MISSING else f", got {_show(value)}"
        return WireError(f"{self.route}: {self.name(key)} must be {must}{got}")

    def refuse(self, feature: str, detail: str) -> Unsupported:
        return Unsupported(f"{self.route}: {detail} is not supported: {_REASONS[feature]}")

    def raw(self, key: str, required: bool) -> Any:
        value = self.body.get(key)
        if value is None:
            if required:
                raise WireError(f"{self.route}: {self.name(key)} is required")
            return _MISSING
        return value

    def text(self, key: str, required: bool = True) -> Any:
        value = self.raw(key, required)
        if value is not _MISSING and (not isinstance(value, str) or not value):
            raise self.error(key, "a non-empty string", value)
        return None if value is _MISSING else value

    def integer(self, key: str, default: Any = _MISSING, lo: int = -_INT64, hi: int = _INT64, must: str = "") -> Any:
        value = self.raw(key, default is _MISSING)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.error(key, must or f"an integer >= {lo}", value)
        return value

    def number(self, key: str, default: float, ok: Callable[[float], bool], must: str) -> float:
        value = self.raw(key, False)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not ok(value):
            raise self.error(key, f"a finite number {must}", value)
        return float(value)

    def flag(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default is _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def obj(self, key: str, required: bool = False) -> _Fields | None:
        value = self.raw(key, required)
        return None if value is _MISSING else _Fields(self.route, value, self.name(key))

    def metadata(self, key: str, strings: bool = False) -> dict[str, Any] | None:
        fields = self.obj(key)
        if fields is None:
            return None
        if strings and not all(isinstance(v, str) for v in fields.body.values()):
            raise self.error(key, "an object of strings", fields.body)
        return dict(fields.body)


class TinkerPath(NamedTuple):
    training_run_id: str  # the model id, "{session_id}:train:{n}"
    kind: str  # "weights" (save_state: weights + optimizer) or "sampler_weights"
    name: str  # the checkpoint's name: no "/", not "." or "..", no control characters


def check_name(route: str, field: str, name: object) -> str:
    """A checkpoint name (it becomes a folder name): a non-empty string without `/`, `\\`, control characters or a
    leading `.`, at most 200 characters."""
    if not isinstance(name, str) or not 0 < len(name) <= 200 or name.startswith(".") \
            or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name):
        raise WireError(f"{route}: {field} must be a checkpoint name (no '/', '\\', control characters or leading "
                        f"'.', at most 200 characters), got {_show(name)}")
    return name


def parse_tinker_path(path: object, route: str = "path", field: str = "path") -> TinkerPath:
    """`tinker://{training_run_id}/{weights|sampler_weights}/{name}` (exactly three segments) -> its parts."""
    if not isinstance(path, str) or not path.startswith("tinker://"):
        raise WireError(f"{route}: {field} must be a tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME "
                        f"path, got {_show(path)}")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or not parts[0] or parts[1] not in ("weights", "sampler_weights"):
        raise WireError(f"{route}: {field} must be tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME "
                        f"(three segments), got {_show(path)}")
    return TinkerPath(parts[0], parts[1], check_name(route, field, parts[2]))


# ---- sessions, models, futures ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CreateSession:
    tags: tuple[str, ...]
    user_metadata: dict[str, Any] | None
    sdk_version: str
    project_id: str | None
    display_name: str | None


@dataclass(frozen=True)
class SessionHeartbeat:
    session_id: str


@dataclass(frozen=True)
class LoraConfig:
    rank: int  # 0: full fine-tuning (every parameter trained)
    seed: int | None
    train_mlp: bool
    train_attn: bool
    train_unembed: bool


@dataclass(frozen=True)
class CreateModel:
    session_id: str
    model_seq_id: int
    base_model: str
    lora: LoraConfig  # rank 0 (full fine-tuning) when the body has no lora_config
    user_metadata: dict[str, Any] | None

    @property
    def model_id(self) -> str:
        return f"{self.session_id}:train:{self.model_seq_id}"  # the id the client derives (it must be this)


@dataclass(frozen=True)
class GetInfo:
    model_id: str


@dataclass(frozen=True)
class RetrieveFuture:
    request_id: str
    allow_metadata_only: bool


def _create_session(f: _Fields) -> CreateSession:
    tags = f.raw("tags", True)
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise f.error("tags", "a list of strings", tags)
    return CreateSession(tuple(tags), f.metadata("user_metadata"), f.text("sdk_version"),
                         f.text("project_id", False), f.text("display_name", False))


def _optimizer_config(f: _Fields) -> None:
    """`optimizer_config`: absent or {"type": "adamw"}; any other optimizer is refused."""
    config = f.obj("optimizer_config")
    if config is not None:
        kind = config.raw("type", False)
        if kind is not _MISSING and kind != "adamw":
            if not isinstance(kind, str):
                raise config.error("type", "a string", kind)
            raise config.refuse(DIMUON, f"optimizer_config.type {kind!r}")


def _lora(f: _Fields) -> LoraConfig:
    config = f.obj("lora_config")
    if config is None:
        return LoraConfig(0, None, True, True, True)
    lora = LoraConfig(config.integer("rank", lo=0, must="an integer >= 0 (0: full fine-tuning)"),
                      config.integer("seed", None, lo=0), config.flag("train_mlp", True),
                      config.flag("train_attn", True), config.flag("train_unembed", True))
    if lora.rank and not (lora.train_mlp or lora.train_attn or lora.train_unembed):
        raise WireError(f"{f.route}: lora_config: train_mlp, train_attn and train_unembed are all false (nothing to "
                        "train)")
    return lora


def _create_model(f: _Fields) -> CreateModel:
    _optimizer_config(f)
    return CreateModel(f.text("session_id"), f.integer("model_seq_id", lo=0), f.text("base_model"), _lora(f),
                       f.metadata("user_metadata"))


# ---- training -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdamParams:
    """torch.optim.AdamW's (decoupled weight decay); grad_clip_norm 0 = no clipping. Defaults: the client's."""
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class OptimStep:
    model_id: str
    seq_id: int | None
    adam: AdamParams


@dataclass(frozen=True)
class SaveWeights:
    """save_state: weights and optimizer state, as tinker://{model_id}/weights/{path}."""
    model_id: str
    seq_id: int | None
    path: str | None  # the checkpoint's name; None: the server names it
    overwrite: bool
    ttl_seconds: int | None
    user_metadata: dict[str, str] | None


@dataclass(frozen=True)
class SaveWeightsForSampler:
    """Named (`path`: tinker://{model_id}/sampler_weights/{path}, answered with the path) or unnamed
    (`sampling_session_seq_id`, from save_weights_and_get_sampling_client: answered with a sampling session id)."""
    model_id: str
    seq_id: int | None
    path: str | None
    sampling_session_seq_id: int | None
    ttl_seconds: int | None
    user_metadata: dict[str, str] | None


@dataclass(frozen=True)
class LoadWeights:
    """Either a new model from a saved state (`session_id` + `model_seq_id`: ServiceClient.create_training_client_
    from_state[_with_optimizer]; the model id is `new_model_id`) or, deprecated, into an existing model (`model_id` +
    `seq_id`: TrainingClient.load_state)."""
    path: str
    checkpoint: TinkerPath  # kind "weights"
    optimizer: bool  # also restore the optimizer state
    session_id: str | None
    model_seq_id: int | None
    model_id: str | None
    seq_id: int | None
    base_model: str | None

    @property
    def new_model_id(self) -> str | None:
        return None if self.session_id is None else f"{self.session_id}:train:{self.model_seq_id}"


def _adam(f: _Fields) -> AdamParams:
    for key in ("optimizer_params", "optim_params"):
        other = f.obj(key)
        if other is not None and (key == "optimizer_params" or other.raw("type", False) is not _MISSING):
            raise f.refuse(DIMUON, f"{key} of type {_show(other.body.get('type'))}")
    params = f.obj("adam_params") or f.obj("optim_params")
    if params is None:
        raise WireError(f"{f.route}: adam_params is required")
    return AdamParams(params.number("learning_rate", 1e-4, lambda x: x >= 0, ">= 0"),
                      params.number("beta1", 0.9, lambda x: 0 <= x < 1, "in [0, 1)"),
                      params.number("beta2", 0.95, lambda x: 0 <= x < 1, "in [0, 1)"),
                      params.number("eps", 1e-12, lambda x: x > 0, "> 0"),
                      params.number("weight_decay", 0.0, lambda x: x >= 0, ">= 0"),
                      params.number("grad_clip_norm", 0.0, lambda x: x >= 0, ">= 0 (0: no clipping)"))


def _optim_step(f: _Fields) -> OptimStep:
    return OptimStep(f.text("model_id"), f.integer("seq_id", None, lo=0), _adam(f))


def _save_weights(f: _Fields) -> SaveWeights:
    path = f.raw("path", False)
    return SaveWeights(f.text("model_id"), f.integer("seq_id", None, lo=0),
                       None if path is _MISSING else check_name(f.route, "path", path), f.flag("overwrite", False),
                       f.integer("ttl_seconds", None, lo=1), f.metadata("user_metadata", strings=True))


def _save_weights_for_sampler(f: _Fields) -> SaveWeightsForSampler:
    kind = f.raw("kind", False)
    if kind == "inflight":
        raise f.refuse(INFLIGHT, "kind 'inflight'")
    if kind is not _MISSING and kind != "snapshot":
        raise f.error("kind", "'snapshot' (or 'inflight', refused)", kind)
    path, session_seq = f.raw("path", False), f.integer("sampling_session_seq_id", None, lo=0)
    if (path is _MISSING) == (session_seq is None):
        raise WireError(f"{f.route}: give exactly one of path (a named save) and sampling_session_seq_id (a "
                        "sampling client's weights)")
    return SaveWeightsForSampler(f.text("model_id"), f.integer("seq_id", None, lo=0),
                                 None if path is _MISSING else check_name(f.route, "path", path), session_seq,
                                 f.integer("ttl_seconds", None, lo=1), f.metadata("user_metadata", strings=True))


def _load_weights(f: _Fields) -> LoadWeights:
    path = f.raw("path", True)
    checkpoint = parse_tinker_path(path, f.route)
    if checkpoint.kind != "weights":
        raise WireError(f"{f.route}: path must be a save_state checkpoint (tinker://RUN/weights/NAME), got a "
                        f"{checkpoint.kind} path {_show(path)}")
    new, old = f.raw("session_id", False) is not _MISSING, f.raw("model_id", False) is not _MISSING
    if new == old:
        raise WireError(f"{f.route}: give session_id with model_seq_id (a new model from the state) or model_id with "
                        "seq_id (into an existing model), one of the two")
    _optimizer_config(f)
    return LoadWeights(path, checkpoint, f.flag("optimizer"), f.text("session_id") if new else None,
                       f.integer("model_seq_id", lo=0) if new else None, None if new else f.text("model_id"),
                       None if new else f.integer("seq_id", None, lo=0), f.text("base_model", False))


# ---- sampling -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CreateSamplingSession:
    """model_path (a tinker:// checkpoint) or base_model (sample the untrained base); the client may send both:
    model_path then decides and base_model is the caller's claim about it."""
    session_id: str
    sampling_session_seq_id: int
    model_path: str | None
    checkpoint: TinkerPath | None
    base_model: str | None


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int  # >= 1
    temperature: float  # >= 0 (0: greedy)
    top_k: int  # -1: off, else >= 1
    top_p: float  # in (0, 1]
    stop: tuple[str, ...] | tuple[int, ...] | None  # None: stop at EOS; (): no stop at all, not even EOS
    seed: int | None


@dataclass(frozen=True)
class Asample:
    sampling_session_id: str
    seq_id: int | None
    prompt: tuple[int, ...]  # the prompt's tokens (P,), P >= 1
    num_samples: int
    params: SamplingParams
    prompt_logprobs: bool  # answer with P prompt log-probs, the first None


def _create_sampling_session(f: _Fields) -> CreateSamplingSession:
    path, base = f.raw("model_path", False), f.text("base_model", False)
    if path is _MISSING and base is None:
        raise WireError(f"{f.route}: give model_path (a tinker:// checkpoint) or base_model")
    checkpoint = None if path is _MISSING else parse_tinker_path(path, f.route, "model_path")
    return CreateSamplingSession(f.text("session_id"), f.integer("sampling_session_seq_id", lo=0),
                                 None if path is _MISSING else path, checkpoint, base)


def _prompt(f: _Fields) -> tuple[int, ...]:
    chunks = f.obj("prompt", required=True).raw("chunks", True)  # type: ignore[union-attr]
    if not isinstance(chunks, list):
        raise f.error("prompt.chunks", "a list of chunks", chunks)
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        c = _Fields(f.route, chunk, f"prompt.chunks[{i}]")
        kind = c.raw("type", False)
        if kind in ("image", "image_asset_pointer", "dmel"):
            raise c.refuse(AUDIO if kind == "dmel" else IMAGES, f"prompt.chunks[{i}] of type {kind!r}")
        if kind not in (_MISSING, "encoded_text"):
            raise c.error("type", "'encoded_text'", kind)
        ids = c.raw("tokens", True)
        if not isinstance(ids, list) or not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in ids):
            raise c.error("tokens", f"a list of token ids in [0, {MAX_TOKEN_ID}]", ids)
        tokens.extend(ids)
    if not tokens:
        raise WireError(f"{f.route}: prompt has no tokens")
    return tuple(tokens)


def _stop(p: _Fields) -> tuple[str, ...] | tuple[int, ...] | None:
    stop = p.raw("stop", False)
    if stop is _MISSING:
        return None
    items = [stop] if isinstance(stop, str) else stop
    if isinstance(items, list) and all(isinstance(s, str) and s for s in items):
        return tuple(items)
    if isinstance(items, list) and all(type(s) is int and 0 <= s <= MAX_TOKEN_ID for s in items):
        return tuple(items)
    raise p.error("stop", "a string, a list of non-empty strings or a list of token ids (not mixed)", stop)


def _sampling_params(f: _Fields) -> SamplingParams:
    p = f.obj("sampling_params", required=True)
    assert p is not None
    top_k = p.integer("top_k", -1, lo=-1, must="-1 (off) or an integer >= 1")
    if top_k == 0:
        raise p.error("top_k", "-1 (off) or an integer >= 1", 0)
    return SamplingParams(p.integer("max_tokens", lo=1, must="an integer >= 1 (required)"),
                          p.number("temperature", 1.0, lambda x: x >= 0, ">= 0"), top_k,
                          p.number("top_p", 1.0, lambda x: 0 < x <= 1, "in (0, 1]"), _stop(p),
                          p.integer("seed", None, lo=0, hi=2**64 - 1, must="an integer in [0, 2**64)"))


def _asample(f: _Fields) -> Asample:
    for key, feature in [("topk_prompt_logprobs", TOPK), ("topk_sample_logprobs", TOPK),
                         ("prompt_alt_tokens_k", ALT_TOKENS)]:
        if f.integer(key, 0, lo=0) > 0:
            raise f.refuse(feature, f"{key} > 0")
    for key, feature in [("target_prompt_logprobs", TARGET), ("prompt_logprobs_last_n", LAST_N)]:
        if f.raw(key, False) is not _MISSING:
            raise f.refuse(feature, key)
    if f.flag("record_stability_info", False):
        raise f.refuse(STABILITY, "record_stability_info")
    session = f.raw("sampling_session_id", False)
    if session is _MISSING:
        raise WireError(f"{f.route}: sampling_session_id is required (sample through a sampling client: "
                        "ServiceClient.create_sampling_client or save_weights_and_get_sampling_client)")
    return Asample(f.text("sampling_session_id"), f.integer("seq_id", None, lo=0), _prompt(f),
                   f.integer("num_samples", 1, lo=1), _sampling_params(f), f.flag("prompt_logprobs", False))


_PARSERS: dict[str, Callable[[_Fields], object]] = {
    "create_session": _create_session,
    "session_heartbeat": lambda f: SessionHeartbeat(f.text("session_id")),
    "create_model": _create_model,
    "get_info": lambda f: GetInfo(f.text("model_id")),
    "optim_step": _optim_step,
    "save_weights": _save_weights,
    "save_weights_for_sampler": _save_weights_for_sampler,
    "load_weights": _load_weights,
    "create_sampling_session": _create_sampling_session,
    "asample": _asample,
    "retrieve_future": lambda f: RetrieveFuture(f.text("request_id"), f.flag("allow_metadata_only", False)),
}
ROUTES = frozenset(_PARSERS)  # the JSON routes parse_request reads (POST /api/v1/<route>)


def parse_request(route: str, body: object) -> Any:
    """The JSON body of POST /api/v1/<route> (already json.loads-ed) -> its dataclass; WireError / Unsupported on a
    bad or refused field. A route not in ROUTES is a server bug (ValueError)."""
    route = route.removeprefix("/api/v1/")
    if route not in _PARSERS:
        raise ValueError(f"no JSON parser for route {route!r} (routes: {sorted(_PARSERS)})")
    return _PARSERS[route](_Fields(route, body))
