"""An agent's requests to the endpoint, assembled into one episode with every sampled token kept as sampled.

An agent sends text: each request carries the whole conversation so far (chat) or the whole prompt (completions).
Re-tokenizing that text does not give back the ids the sampler drew (merges across turn boundaries, whitespace, a
template that renders a message differently once the conversation goes on), so the endpoint never does: a session
keeps the episode's token ids itself, and the sampler continues *those*.

    request 1   messages m1..mk       -> rendered by the chat template (`ChatRenderer.start`) + generation prompt
                                         -> sampled tokens a1, kept as sampled (POLICY, with their log-probs)
    request 2   m1..mk, a1', t1..tj   -> a1' is the reply the endpoint returned (content, tool_calls), so the request
                                         EXTENDS the recorded conversation: only t1..tj (tool results, user turns) are
                                         rendered (`ChatRenderer.append_message`) after the recorded ids; the sampler
                                         continues recorded ids + their tokens + the generation prompt

"Extends" is decided on the messages, field by field (`message_key`: role, content, tool calls by id, name and
arguments, tool_call_id; None and "" the same content, text parts joined; fields a client adds such as `refusal`
ignored), never on re-tokenized text. A completions session extends when the new prompt's token ids start with the
recorded ones, or its text starts with the recorded text (then only the new suffix is tokenized).

A request that does not extend the record -- the agent edited, truncated, re-ordered or re-rendered its history,
changed the tools, or wrote an assistant turn itself -- ends the recorded episode there: its trajectory is the
consistent stretch so far (info `history_edited`: the turn it happened at; counted in the metrics as
`agent/edited_share`), and that request and every later one of the session are still served (rendered afresh) but
not recorded. Nothing is ever silently re-tokenized into the trained tokens.

Turns: the opening messages are turn 0, sampled reply k is turn k and the messages after it turn k (as
`trajtune.sources.rollout`); every POLICY token carries the policy version of the request that sampled it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ...text.chat import ChatRenderer, TemplateError
from ...text.render import Transcript
from ...text.tool_calls import ToolFormat
from ...trajectory import Owner, Trajectory
from .openai import APIError
from .responses import finish_reason


def message_key(message: Mapping[str, Any]) -> tuple:
    """What decides whether two chat messages are the same turn: role, content (None = "", text parts joined), the
    tool calls (id, name, arguments parsed from their JSON string), tool_call_id. Other fields are ignored."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    calls = []
    for c in message.get("tool_calls") or ():
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append((c.get("id") or "", fn.get("name"), json.dumps(args, sort_keys=True)))
    return (message.get("role"), content or "", tuple(calls), message.get("tool_call_id") or "")


@dataclass
class Reply:
    """One sampled reply, as the endpoint answers it."""

    text: str
    """the sampled text without its stop token"""
    message: dict
    """the OpenAI assistant message: content (None when only tool calls) and tool_calls"""
    finish_reason: str
    """stop | tool_calls | length"""
    invalid_calls: list[str] = field(default_factory=list)
    """tool calls in the text that did not parse (the text is then returned as content)"""


@dataclass
class Session:
    """One episode's requests (module docstring). `seed`: its sampling stream (each request continues it, so the
    samples do not depend on the other sessions sampled in the same batch); `version`: the policy version that
    serves it; `max_turns`, `max_tokens`: the episode's limits (a request past them is refused and ends it)."""

    id: str
    seed: int | None = None
    version: int = 0
    max_turns: int = 0
    max_tokens: int = 0
    task: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    generator: torch.Generator | None = None
    renderer: ChatRenderer | None = None
    transcript: Transcript | None = None  # the recorded episode so far (chat)
    keys: list = field(default_factory=list)  # message_key of each API message the transcript stands for
    tools_key: str | None = None
    completion: "Completion | None" = None  # the recorded episode so far (completions)
    turns: int = 0  # replies sampled (recorded or not)
    turn_versions: dict[int, int] = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)  # the recorded replies' texts
    edited_at: int | None = None  # the turn at which the agent's history stopped extending the record
    stop_reason: str | None = None  # max_turns | token_budget | time_limit (set when a limit ends it)
    unterminated: int = 0
    cut: bool = False  # the last reply ran out of tokens
    invalid_calls: int = 0
    closed: bool = False
    requests: int = 0

    def __post_init__(self) -> None:
        if self.seed is not None and self.generator is None:
            self.generator = torch.Generator().manual_seed(int(self.seed))

    @property
    def recording(self) -> bool:
        return self.edited_at is None

    def check_open(self) -> None:
        """Refuse a request past the session's turn limit, or after it ended (APIError 400)."""
        if self.closed:
            raise APIError(400, f"session {self.id!r} is over (its episode ended: {self.stop_reason or 'closed'}); "
                           "start a new episode", code="session_closed")
        if self.max_turns and self.turns >= self.max_turns:
            self.stop_reason = self.stop_reason or "max_turns"
            raise APIError(400, f"session {self.id!r}: the episode's turn limit ({self.max_turns} model replies) is "
                           "reached; end the episode", code="turn_limit")

    def check_budget(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        if self.max_tokens and len(prompt) + max_new_tokens > self.max_tokens:
            self.stop_reason = self.stop_reason or "token_budget"
            raise APIError(400, f"This model's maximum context length is {self.max_tokens} tokens (the episode's "
                           f"budget). However, you requested {len(prompt) + max_new_tokens} tokens ({len(prompt)} in "
                           f"the messages, {max_new_tokens} in the completion)", param="messages",
                           code="context_length_exceeded")

    def edit(self) -> None:
        """The agent's history stopped extending the record at this turn (module docstring)."""
        if self.edited_at is None:
            self.edited_at = self.turns


class Chats:
    """Chat requests of sessions: `prompt(session, messages, tools)` -> the ids the sampler continues (recorded or
    rendered afresh, module docstring); `reply(session, tokens, logprobs, stopped)` records the sampled reply and
    answers it. `tokenizer`: the policy's (with its chat template); `fmt`: how its tool calls are written."""

    def __init__(self, tokenizer: Any, fmt: ToolFormat, template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer, self.fmt, self.template_kwargs = tokenizer, fmt, dict(template_kwargs or {})
        self._renderers: dict[str, ChatRenderer] = {}
        self._lock = threading.Lock()
        self.stop_ids = self.renderer(None).stop_ids

    def renderer(self, tools: list | None) -> ChatRenderer:
        """The renderer of a set of tools (a native template reads them; otherwise they are in a system message)."""
        _, tools_arg = self._convert([{"role": "user", "content": ""}], tools)
        key = json.dumps(tools_arg, sort_keys=True)
        with self._lock:
            r = self._renderers.get(key)
            if r is None:
                r = self._renderers[key] = ChatRenderer(self.tokenizer, tools=tools_arg,
                                                        template_kwargs=self.template_kwargs)
        return r

    def prompt(self, session: Session, messages: list[dict], tools: list | None) -> list[int]:
        """The ids the sampler continues for this request (the session's lock held by the caller)."""
        keys = [message_key(m) for m in messages]
        tools_key = json.dumps(tools, sort_keys=True)
        if messages and messages[-1].get("role") == "assistant":
            raise APIError(400, "the conversation ends with an assistant message; the model writes the next one "
                           "(continuing a prefilled reply is not supported)", param=f"messages[{len(messages) - 1}]")
        if session.completion is not None and session.recording:
            session.edit()  # a chat request in a completions session: a different history
        if session.transcript is None and session.recording:
            session.renderer = self.renderer(tools)
            session.transcript = self._start(session.renderer, messages, tools)
            session.keys, session.tools_key = keys, tools_key
            return session.renderer.prompt_ids(session.transcript)
        n = len(session.keys)
        new = messages[n:]
        extends = (session.recording and tools_key == session.tools_key and keys[:n] == session.keys and new
                   and all(m.get("role") != "assistant" for m in new))
        if extends:
            assert session.renderer is not None and session.transcript is not None
            converted = self._convert(new, None)[0]
            try:
                for m in converted:
                    session.renderer.append_message(session.transcript, m, session.turns)
                session.keys = keys
                return session.renderer.prompt_ids(session.transcript)
            except TemplateError:  # the template re-renders earlier turns once this message follows: not exact
                pass
        session.edit()
        return self.renderer(tools).prompt_ids(self._start(self.renderer(tools), messages, tools))

    def _convert(self, messages: list[dict], tools: list | None) -> tuple[list[dict], list | None]:
        """`fmt.template_messages`, bad input a 400 naming the field."""
        try:
            return self.fmt.template_messages(messages, tools)
        except TemplateError:
            raise
        except ValueError as e:
            field = str(e).split(":", 1)[0]
            raise APIError(400, str(e), param=field if field.startswith(("messages", "tools")) else None) from None

    def _start(self, renderer: ChatRenderer, messages: list[dict], tools: list | None) -> Transcript:
        converted, _ = self._convert(messages, tools)
        try:
            return renderer.start(converted)
        except TemplateError as e:
            raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from None

    def reply(self, session: Session, tokens: Sequence[int], logprobs: Sequence[float], stopped: bool,
              call_prefix: str) -> Reply:
        """Record one sampled reply (when the session still records) and answer it."""
        renderer = session.renderer or self.renderer(None)
        text = renderer.action_text(tokens)
        content, calls, errors = self.fmt.parse(text)
        tool_calls = self.fmt.openai_tool_calls(calls, call_prefix) if calls else []
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        if session.recording and session.transcript is not None:
            renderer.append_sampled(session.transcript, tokens, logprobs, session.turns)
            session.keys.append(message_key(message))
            session.actions.append(text)
            session.turn_versions[session.turns] = session.version
        record_turn(session, stopped, len(errors))
        return Reply(text, message, finish_reason(stopped, bool(tool_calls)), errors)

    def trajectory(self, session: Session) -> Trajectory:
        """The session's recorded episode (an empty prompt when the agent never asked: no POLICY tokens)."""
        if session.transcript is None:
            return self.renderer(None).start([{"role": "user", "content": ""}]).traj
        return versioned(session.transcript.traj, session.turn_versions)


@dataclass
class Completion:
    """A completions session's recorded ids: prompt text PROMPT-owned, what followed each reply TOOL-owned."""

    traj: Trajectory
    text: str


class Completions:
    """Completions requests of sessions: a prompt of text or token ids, recorded exactly (module docstring)."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int]):
        self.tokenizer, self.stop_ids = tokenizer, tuple(stop_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text (OpenAI's log-prob entries)."""
        return [self.decode([i]) for i in ids]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt(self, session: Session, prompt: str | list[int]) -> list[int]:
        ids = list(prompt) if isinstance(prompt, list) else None
        if session.transcript is not None and session.recording:
            session.edit()  # a completions request in a chat session
        done = session.completion
        if done is None and session.recording:
            ids = ids if ids is not None else self.encode(str(prompt))
            traj = Trajectory(list(ids), [int(Owner.PROMPT)] * len(ids), [0] * len(ids))
            session.completion = Completion(traj, self.decode(ids))
            return list(ids)
        if done is not None and session.recording:
            recorded = done.traj.ids
            suffix: list[int] | None = None
            if ids is not None and ids[: len(recorded)] == recorded and len(ids) > len(recorded):
                suffix = ids[len(recorded):]
            elif ids is None and str(prompt).startswith(done.text) and len(str(prompt)) > len(done.text):
                suffix = self.encode(str(prompt)[len(done.text):])
            if suffix:
                done.traj.append(suffix, Owner.TOOL, session.turns)
                done.text = self.decode(done.traj.ids)
                return list(done.traj.ids)
            session.edit()
        return ids if ids is not None else self.encode(str(prompt))

    def reply(self, session: Session, tokens: Sequence[int], logprobs: Sequence[float], stopped: bool) -> str:
        ids = list(tokens)
        text = self.decode(ids[:-1] if stopped and ids and ids[-1] in self.stop_ids else ids)
        if session.recording and session.completion is not None:
            session.completion.traj.append(ids, Owner.POLICY, session.turns, logprobs=list(logprobs))
            session.completion.text = self.decode(session.completion.traj.ids)
            session.actions.append(text)
            session.turn_versions[session.turns] = session.version
        record_turn(session, stopped, 0)
        return text


def record_turn(session: Session, stopped: bool, invalid_calls: int) -> None:
    session.turns += 1
    session.unterminated += not stopped
    session.cut = not stopped
    session.invalid_calls += invalid_calls


def versioned(traj: Trajectory, turn_versions: Mapping[int, int]) -> Trajectory:
    """`traj` with every POLICY token stamped with the version of the request that sampled it (-1 elsewhere)."""
    if turn_versions:
        traj.versions = [turn_versions.get(t, -1) if o == Owner.POLICY else -1
                         for o, t in zip(traj.owners, traj.turns, strict=True)]
    return traj
