"""The sampler process's own side (`SamplerProcess` in process.py is the trainer's): its loop, its log records
forwarded to the trainer, and the messages' pieces both sides read (exceptions, generator states).

    serve(conn, ...)   answer rollout / sync / close messages until close or EOF (the process's target)
    round_weights(...) the process's copy rounded to bf16 / float8 and back (`sampling.sampler_dtype`)
    emit(records)      the trainer logs the process's records with its own handlers
    reraised(...)      the process's exception, to raise in the trainer as itself (its traceback a note)

Messages are pickled with the standard pickler and sent as bytes, never through torch's pickler, which
would move each tensor into a new shared-memory segment and pass its file descriptor.
"""

from __future__ import annotations

import functools
import logging
import pickle
import signal
import traceback
from typing import Any, Sequence

import torch

from ..engine.decoding import sample
from ..processes import exit_with_parent
from .episodes import run_episodes
from .sampler import Decoder
from .sync import sampler_logprobs, weight_fingerprints


def serve(conn, trainer_end, model: Any, shared: dict[str, torch.Tensor], threads: int, autocast: str | None,
          device: str, levels: dict[str, int], weights_dtype: str = "fp32") -> None:
    """The sampler process: answer rollout / sync / close messages until close or EOF. Ctrl-C in a terminal
    (or a scheduler's SIGTERM) signals the whole process group: the trainer saves and stops the run (closing
    this process), so the
    signals are ignored here (it is killed if need be). `model`: the trainer's (a fork's copy) or its pickle
    (a fork server's child). `weights_dtype`: the precision the process samples in (`round_weights` after every
    load; the fingerprints it answers are of the weights it received, before the rounding)."""
    trainer_end.close()  # a fork's copy of it: held here, the trainer's death would never close the pipe
    for sig in (signal.SIGINT, signal.SIGTERM):  # (a fork inherits the trainer's checkpointing handlers)
        signal.signal(sig, signal.SIG_IGN)
    exit_with_parent()
    torch.set_num_threads(threads)
    records = _log_to_trainer(levels)
    model = (pickle.loads(model) if isinstance(model, bytes) else model).to(device).eval()
    own = model.state_dict()  # views of the model's tensors: copying into them updates the model
    held = weight_fingerprints(model)  # what this process holds (a sync changing nothing: an error in the trainer)
    round_weights(own, weights_dtype)
    decode = functools.partial(sample, model)  # what `engine.sample` is in the trainer, on this copy
    renderers: dict[int, Any] = {}
    while True:
        try:
            kind, *args = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        records.records = []
        reply: Any
        message: tuple
        try:
            if kind == "close":
                return
            if kind == "rollout":
                envs, tasks, rid, renderer, state, settings, (limits, groups, row_seeds) = pickle.loads(args[0])
                if renderer is not None:
                    renderers[rid] = renderer
                g = _generator(state)
                trajs = run_episodes(Decoder(decode, settings), envs, tasks, renderers[rid], g, limits, groups,
                                     row_seeds)
                reply = (trajs, state_bytes(g) if g is not None else None, records.records)
            elif kind == "sample":  # `SamplerProcess.sample`: the Sampler seam on this copy of the weights
                prompts, stop_ids, states, settings = pickle.loads(args[0])
                gens = [_generator(s) for s in states]
                seeds: Any = gens if isinstance(states, list) else gens[0]  # one per row, or one for the call
                samples = Decoder(decode, settings).sample(prompts, stop_ids, seeds)
                reply = (samples, [state_bytes(g) if g is not None else None for g in gens], records.records)
            elif kind == "sync":
                ids, mask = args
                with torch.no_grad():
                    for k, v in own.items():
                        v.copy_(shared[k])
                after = weight_fingerprints(model)  # what it received
                round_weights(own, weights_dtype)  # what it samples with
                logp = sampler_logprobs(model, torch.from_numpy(ids), torch.from_numpy(mask), autocast)
                reply, held = (held != after, after, logp.numpy()), after
            else:
                raise ValueError(f"unknown message {kind!r}")
            message = ("ok", reply)
        except Exception as e:  # noqa: BLE001 - sent back to the trainer, which raises it there
            message = ("error", _picklable(e), traceback.format_exc(), records.records)
        try:
            conn.send_bytes(pickle.dumps(message))
        except (BrokenPipeError, OSError):  # the trainer is gone
            return


ROUNDED = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
"""`sampling.sampler_dtype` -> the dtype the sampler process rounds its weights to ("fp32": none)"""


@torch.no_grad()
def round_weights(state: dict[str, torch.Tensor], weights_dtype: str) -> None:
    """Round every floating tensor of `state` (a model's state dict: views of its weights) in place to
    `weights_dtype` ("bf16", "fp8": float8 e4m3, round to nearest, saturating at +-448) and back to its own dtype:
    the model then computes in fp32 with the low-precision values (fake quantisation). "fp32": unchanged."""
    if weights_dtype == "fp32":
        return
    low = ROUNDED[weights_dtype]
    for v in state.values():
        if v.is_floating_point():
            v.copy_(v.to(low).to(v.dtype) if low != torch.float8_e4m3fn else v.clamp(-448, 448).to(low).to(v.dtype))


def _log_to_trainer(levels: dict[str, int]) -> "_Records":
    """Every record of this process goes to one `_Records` handler (the trainer re-emits them): a fork's
    copies of the trainer's handlers are removed, and its loggers' levels are the trainer's."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        lg.handlers, lg.propagate = [], True
    records = _Records()
    logging.getLogger().addHandler(records)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    return records


class _Records(logging.Handler):
    """This process's log records of the current call, made picklable (message and traceback as text),
    for the trainer to re-emit with its own handlers."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def emit(records: Sequence[logging.LogRecord]) -> None:
    """Log the sampler process's records here, by their loggers (the trainer's handlers and levels)."""
    for r in records:
        logger = logging.getLogger(r.name)
        if logger.isEnabledFor(r.levelno):
            logger.handle(r)


def _picklable(exc: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - the traceback text still travels
        return None


def reraised(exc_bytes: bytes | None, tb: str, kind: str) -> BaseException:
    """The sampler's exception, to raise in the trainer: the same type and message (a user error stays a
    one-line error), its traceback in the sampler process as a note."""
    exc = pickle.loads(exc_bytes) if exc_bytes is not None else None
    if exc is None:
        return RuntimeError(f"the sampler process failed on {kind!r}:\n{tb}")
    exc.add_note(f"raised in the sampler process ({kind!r}):\n{tb}")
    return exc


def _generator(state: bytes | None) -> torch.Generator | None:
    if state is None:
        return None
    g = torch.Generator()
    g.set_state(state_tensor(state))
    return g


def state_bytes(g: torch.Generator) -> bytes:
    return g.get_state().numpy().tobytes()


def state_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)
