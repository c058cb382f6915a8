"""Black-box agents as a source: `AgentSource` runs a user's agent program per episode against the endpoint.

An agent is any function (sync or `async def`) that talks to an OpenAI-compatible endpoint:

    def run(task, base_url: str, session: str) -> float | None:
        client = openai.OpenAI(base_url=base_url, api_key="-")
        ... a loop: client.chat.completions.create(model="policy", messages=..., tools=...), call tools ...
        return reward          # or None: the run's graders score the episode (its last reply)

`AgentSource(sampler, tokenizer, agent)` is a `Source`: `take(draw)` opens one session of the endpoint per episode
(`draw.n` of each task, task-major, group i for `draw.tasks[i]`), runs the agents at once (`concurrency` threads, or
one event loop for `async def` agents), and returns each session's recorded episode (`sessions`: the POLICY tokens
exactly as sampled, every token with the policy version that sampled it) with the agent's reward. The endpoint is
started at the first draw on `host:port` (127.0.0.1 and a free port by default) and closed with the source.

Limits and failures, each counted in the step's metrics (`agent/*`):

    an agent that raises            ENV_ERROR (its task and traceback logged): no loss or group baseline sees it
    an agent past `timeout_s`       ENV_ERROR; its session is closed, so its next request fails (a thread cannot be
                                    stopped: it finishes in the background; an async agent is cancelled)
    max_turns replies               the next request is refused (400 turn_limit); the episode ends there
                                    (stop_reason max_turns), with the reward the agent returns (0 if it raises)
    max_tokens                      a request whose prompt + reply budget exceeds it is refused (400
                                    context_length_exceeded); stop_reason token_budget, as above
    a history the agent edited      the episode is the consistent stretch before it (`sessions`, agent/edited_share)
    reward None without graders     UNSCORED (with graders -- `Scored` around the source -- their weighted sum is
                                    the reward, as for every episode; it replaces a number the agent returned)

Seeding: episode e of a draw samples from its own stream, seeded from one draw of the draw's generator
(`seeding.episode_seed`), so its tokens do not depend on the other agents' timing; a deterministic agent gives the
same run twice. With an overlapped source (`sampling.max_staleness`) the sampler is the sampler process or vLLM,
and `Draw.version` names the weights that serve the draw (each answer's `policy_version`). Partial rollouts
(`sampling.stale partial`) need the built-in episode loop's lockstep clock and are refused with agents.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import inspect
import logging
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch

from ...config import ConfigError, check_choices
from ...metrics import register
from ...seeding import episode_seed
from ...trajectory import Outcome, Trajectory
from ..base import Draw, Episodes, Schedule
from ..faults import check_faults
from ..sampler import Sampler
from .server import Endpoint

log = logging.getLogger("trajtune.sources.endpoint.agents")

register("agent/turns", "an agent run (--agent): model replies per episode, mean over the step's episodes")
register("agent/error_share", "an agent run: share of episodes whose agent raised or ran past --agent-timeout "
         "(ENV_ERROR: out of the loss and the group baseline)")
register("agent/cut_share", "an agent run: share of episodes cut at --max-turns replies or at the length budget "
         "(the next request refused)")
register("agent/edited_share", "an agent run: share of episodes whose agent sent a history that did not extend the "
         "recorded one (the episode is the stretch before it: trajtune.sources.endpoint.sessions)")
register("agent/invalid_tool_calls", "an agent run: replies whose tool calls did not parse in the model's format "
         "(returned to the agent as text)")

Agent = Callable[[Any, str, str], Any]
"""run(task, base_url, session) -> reward (float) or None; sync or async"""


class AgentError(ConfigError):
    """An agent that cannot be loaded or called (a bad `--agent FILE:FUNCTION`)."""


def load_agent(spec: str) -> Agent:
    """`path/to/file.py:function` or `package.module:function` -> the agent function (AgentError naming what is
    wrong)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise AgentError(f"agent {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise AgentError(f"agent {spec!r}: no file {where}")
        module_spec = importlib.util.spec_from_file_location(f"trajtune_agent_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise AgentError(f"agent {spec!r}: importing {where} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise AgentError(f"agent {spec!r}: cannot import {where}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AgentError(f"agent {spec!r}: {where} has no function {name!r}")
    try:
        inspect.signature(fn).bind(None, "", "")
    except TypeError:
        raise AgentError(f"agent {spec!r}: {name} must take (task, base_url, session)") from None
    return fn


@dataclass
class AgentConfig:
    """A run whose episodes are an agent program's sessions with the run's endpoint (module docstring); `trajtune
    grpo --agent FILE.py:FUNCTION`, a recipe's [config.agent]."""

    run: str = ""
    """the agent: 'file.py:function' or 'module:function', called as run(task, base_url, session) -> reward or None
    (sync or async def); empty: no agent (the built-in episode loop)"""
    max_turns: int = 6
    """model replies per episode; the next request is refused (400 turn_limit) and the episode ends there"""
    agent_timeout: float = 300.0
    """seconds an agent may run per episode (0: no limit); past it the episode is an ENV_ERROR"""
    agent_concurrency: int = 0
    """agents run at once (0: every episode of the step)"""
    endpoint_host: str = "127.0.0.1"
    """where the run's endpoint listens (0.0.0.0: reachable from other machines)"""
    endpoint_port: int = 0
    """the endpoint's port (0: a free one)"""
    endpoint_url: str = ""
    """the URL agents are given when they reach the endpoint by another name (agents on another machine)"""
    tool_syntax: Literal["", "json", "python"] = ""
    """how a model whose chat template has no tool calls writes them (json: <tool_call> blocks; python: f(x=1)
    lines; empty: json), `trajtune.text.tool_calls`"""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.max_turns < 1 or self.agent_timeout < 0 or self.agent_concurrency < 0:
            raise ValueError(f"agent: max_turns must be >= 1 and agent_timeout, agent_concurrency >= 0, got "
                             f"{self.max_turns}, {self.agent_timeout}, {self.agent_concurrency}")

    def source(self, sampler: Sampler, tokenizer: Any, *, max_tokens: int, shard: Any = None, holder: Any = None,
               graded: bool = False, template_kwargs: dict | None = None, row_seeds: bool = True) -> "AgentSource":
        """The AgentSource this section describes, over `sampler`."""
        return AgentSource(sampler, tokenizer, load_agent(self.run), max_turns=self.max_turns, max_tokens=max_tokens,
                           timeout_s=self.agent_timeout, concurrency=self.agent_concurrency, shard=shard,
                           holder=holder, graded=graded, host=self.endpoint_host, port=self.endpoint_port,
                           public_url=self.endpoint_url, tool_syntax=self.tool_syntax or None,
                           template_kwargs=template_kwargs, row_seeds=row_seeds)


class AgentSource:
    """Episodes of `agent` against an endpoint over `sampler` (module docstring). `tokenizer`: the policy's (chat
    template); `served`: the model names agents may ask for; `shard`: under torchrun, this rank's share of the
    episodes (gathered); endpoint options: host, port, public_url, tool_syntax, batch_wait_s, template_kwargs.
    `holder`: the sampler process or vLLM runner that holds its own weights (after_update, probe rows)."""

    def __init__(self, sampler: Sampler, tokenizer: Any, agent: Agent, *, max_turns: int = 6, max_tokens: int = 2048,
                 timeout_s: float = 300.0, concurrency: int = 0, served: Sequence[str] = ("policy",),
                 shard: Any = None, holder: Any = None, max_fault_share: float = 0.5, graded: bool = False,
                 **endpoint: Any):
        self.graded = graded  # the run's graders score the episodes (an agent's None is theirs to score)
        self.agent, self.max_turns, self.max_tokens, self.timeout_s = agent, max_turns, max_tokens, timeout_s
        self.concurrency, self.shard, self.holder, self.max_fault_share = concurrency, shard, holder, max_fault_share
        self.endpoint = Endpoint(sampler, tokenizer, served=served, **endpoint)
        self.is_async = inspect.iscoroutinefunction(agent)

    def take(self, draw: Draw, ahead: Schedule | None = None) -> Episodes:
        t0 = time.perf_counter()
        self.endpoint.start()
        batch = [task for task in draw.tasks for _ in range(draw.n)]
        groups = [i for i in range(len(draw.tasks)) for _ in range(draw.n)]
        base = int(torch.randint(0, 2**62, (1,), generator=draw.generator))
        mine = list(range(len(batch))) if self.shard is None else self.shard.rows(len(batch))
        trajs = self.run([batch[i] for i in mine], [groups[i] for i in mine],
                         [episode_seed(base, i) for i in mine], [f"{draw.step}-{i}" for i in mine], draw.sampled_by)
        if self.shard is not None:
            trajs = self.shard.gather(len(batch), trajs)
        check_faults(trajs, self.max_fault_share)
        if self.holder is not None and hasattr(self.holder, "keep_probe_rows"):
            self.holder.keep_probe_rows(trajs)
        metrics = {"time/sampling_s": time.perf_counter() - t0, **agent_metrics(trajs)}
        return Episodes(trajs, metrics, draw.generator, draw.step)

    def run(self, tasks: Sequence[Any], groups: Sequence[int], seeds: Sequence[int], ids: Sequence[str],
            version: int) -> list[Trajectory]:
        """One episode per task: its session opened, its agent run, its trajectory built (in order)."""
        sessions = [self.endpoint.open(sid, seed=seed, version=version, max_turns=self.max_turns,
                                       max_tokens=self.max_tokens, task=task)
                    for sid, seed, task in zip(ids, seeds, tasks, strict=True)]
        calls = [(task, self.endpoint.base_url(s.id), s.id) for task, s in zip(tasks, sessions, strict=True)]
        results = self._run_async(calls) if self.is_async else self._run_threads(calls)
        failure = self.endpoint.failure
        if failure is not None:  # the sampler failed (a sync, a dead process): the run's failure, not the agents'
            for s in sessions:
                if not s.closed:
                    self.endpoint.finish(s.id)
            raise failure
        return [self._episode(s, task, group, result)
                for s, task, group, result in zip(sessions, tasks, groups, results, strict=True)]

    def _run_threads(self, calls: list[tuple]) -> list[tuple]:
        """Every call in a thread (`concurrency` at once), each timed from its own start; one past `timeout_s` is
        answered "timeout" and its session closed (the thread itself cannot be stopped: it ends in the background,
        in a pool of this draw's own, so it never holds up a later draw)."""
        pool = concurrent.futures.ThreadPoolExecutor(self.concurrency or max(1, len(calls)),
                                                     thread_name_prefix="trajtune-agent")
        started: dict[str, float] = {}

        def call(task: Any, base_url: str, sid: str) -> tuple:
            started[sid] = time.monotonic()
            return self._call(task, base_url, sid)

        try:
            futures = {pool.submit(call, *c): i for i, c in enumerate(calls)}
            results: list[tuple | None] = [None] * len(calls)
            pending = set(futures)
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=0.05 if self.timeout_s else None)
                for f in done:
                    results[futures[f]] = f.result()
                now = time.monotonic()
                for f in list(pending):
                    sid = calls[futures[f]][2]
                    if self.timeout_s and sid in started and now - started[sid] > self.timeout_s:
                        pending.discard(f)
                        results[futures[f]] = ("timeout", None)
                        self._close(sid, "time_limit")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return [r for r in results if r is not None]

    def _call(self, task: Any, base_url: str, sid: str) -> tuple:
        try:
            out = ("ok", self.agent(task, base_url, sid))
        except Exception as e:  # noqa: BLE001 - the user's agent: its failure is its episode's
            out = ("error", (e, traceback.format_exc()))
        self._close(sid, None)
        return out

    def _run_async(self, calls: list[tuple]) -> list[tuple]:
        async def one(task: Any, base_url: str, sid: str) -> tuple:
            try:
                coro = self.agent(task, base_url, sid)
                out = ("ok", await (asyncio.wait_for(coro, self.timeout_s) if self.timeout_s else coro))
            except asyncio.TimeoutError:
                out = ("timeout", None)
                self._close(sid, "time_limit")
            except Exception as e:  # noqa: BLE001 - the user's agent: its failure is its episode's
                out = ("error", (e, traceback.format_exc()))
            self._close(sid, None)
            return out

        async def everything() -> list[tuple]:
            limit = asyncio.Semaphore(self.concurrency or max(1, len(calls)))

            async def bounded(c: tuple) -> tuple:
                async with limit:
                    return await one(*c)
            return list(await asyncio.gather(*(bounded(c) for c in calls)))

        box: list = []
        thread = threading.Thread(target=lambda: box.append(asyncio.run(everything())), name="trajtune-agents")
        thread.start()  # (its own thread: the caller may itself run in an event loop, e.g. a notebook)
        thread.join()
        if not box:
            raise RuntimeError("the agents' event loop ended without results")
        return box[0]

    def _close(self, sid: str, reason: str | None) -> None:
        self.endpoint.finish(sid, reason)  # (a second close of the same session, its agent ending late: nothing)

    def _episode(self, session: Any, task: Any, group: int, result: tuple) -> Trajectory:
        traj = self.endpoint.trajectory(session)
        kind, value = result
        name = getattr(task, "name", str(task))
        info: dict[str, Any] = {"task": name, "session": session.id, "actions": list(session.actions),
                                "n_turns": session.turns, "requests": session.requests}
        cut = session.stop_reason in ("max_turns", "token_budget")
        reward, outcome = 0.0, Outcome.OK
        if kind == "timeout":
            outcome, info["env_error"] = Outcome.ENV_ERROR, f"TimeoutError: the agent ran past {self.timeout_s:g} s"
            log.warning("agent on task %s ran past its time limit (%g s): the episode is an infrastructure failure "
                        "(no loss or baseline sees it)", name, self.timeout_s)
        elif kind == "error" and not cut:
            exc, tb = value
            outcome, info["env_error"] = Outcome.ENV_ERROR, f"{type(exc).__name__}: {exc}"
            log.warning("agent on task %s raised %s: %s (the episode is an infrastructure failure: no loss or "
                        "baseline sees it)\n%s", name, type(exc).__name__, exc, tb)
        elif kind == "ok" and value is None:
            outcome = Outcome.OK if self.graded else Outcome.UNSCORED  # the run's graders score it (`Scored`)
        elif kind == "ok":
            try:
                reward = float(value)
            except (TypeError, ValueError):
                outcome, info["env_error"] = Outcome.ENV_ERROR, f"the agent returned {value!r}, not a number"
            else:
                if not math.isfinite(reward):
                    outcome, info["env_error"], reward = Outcome.ENV_ERROR, f"the agent returned {value!r}", 0.0
        stop = "env_error" if outcome is Outcome.ENV_ERROR else session.stop_reason or (
            "length" if session.cut else "done")
        info["stop_reason"] = stop
        if session.edited_at is not None:
            info["history_edited"] = session.edited_at
        if session.invalid_calls:
            info["invalid_tool_calls"] = session.invalid_calls
        traj.reward, traj.group, traj.info, traj.outcome = reward, group, info, outcome
        traj.unterminated = session.unterminated
        traj.temperature = self.endpoint.sampler.settings.policy_temperature
        return traj

    def after_update(self, engine: Any) -> dict[str, float]:
        return self.holder.after_update(engine) if self.holder is not None else {}

    def pending(self) -> list[Episodes]:
        return []

    def restore(self, episodes: list[Episodes]) -> None:
        if episodes:
            raise ValueError("AgentSource draws nothing ahead; a checkpoint's pending episodes belong to an "
                             "overlapped source (trajtune.sources.overlap.Overlapped)")

    def close(self) -> None:
        self.endpoint.close()
        if self.holder is not None and hasattr(self.holder, "close"):
            self.holder.close()

    def __enter__(self) -> "AgentSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def agent_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """A draw's agent counts: turns, failures, cut and edited episodes, invalid tool calls (`agent/*`)."""
    n = max(1, len(trajs))
    info = [t.info for t in trajs]
    return {"agent/turns": sum(i.get("n_turns", 0) for i in info) / n,
            "agent/error_share": sum(t.outcome is Outcome.ENV_ERROR for t in trajs) / n,
            "agent/cut_share": sum(i.get("stop_reason") in ("max_turns", "token_budget") for i in info) / n,
            "agent/edited_share": sum("history_edited" in i for i in info) / n,
            "agent/invalid_tool_calls": float(sum(i.get("invalid_tool_calls", 0) for i in info))}
