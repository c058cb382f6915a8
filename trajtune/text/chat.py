"""Chat-template rendering with token owners: the Hugging Face tokenizer's own template, tagged.

`ChatRenderer` renders conversations with `tokenizer.apply_chat_template` and
tags every token with its owner, so a Hugging Face model is trained on exactly
the tokens its template produces (tests check `ids == apply_chat_template(...)`)
and only on what the assistant wrote:

    <|im_start|>system\\n ... <|im_end|>\\n     TEMPLATE, PROMPT.., TEMPLATE
    <|im_start|>user\\n fix it <|im_end|>\\n    TEMPLATE, PROMPT.., TEMPLATE
    <|im_start|>assistant\\n                   TEMPLATE  (the generation prompt)
    <tool_call>{...}</tool_call><|im_end|>     POLICY    (up to and including the stop token)
    \\n                                        TEMPLATE  (what the template adds after it)
    <|im_start|>tool\\n 3 passed <|im_end|>\\n  TEMPLATE, TOOL.., TEMPLATE

How owners are found: the conversation is rendered prefix by prefix. Message i
owns the text that `messages[:i+1]` adds to `messages[:i]`; for an assistant
message the generation prompt (`add_generation_prompt=True`) is TEMPLATE and the
rest, up to the first stop token, is POLICY. Within a system / user / tool
message the content string is PROMPT / TOOL and the wrapper text TEMPLATE. The
whole text is then tokenized once (with offsets), and each token takes the owner
of its first character. Turns are numbered as in `trajtune.text.render`.

Context turns. `render_samples(messages, context=k)` treats the first k messages as
the prompt: an assistant message among them (a few-shot answer, an earlier wrong
reply the user corrects) is context the model reads, not output it is trained on --
its content is PROMPT and its wrapper TEMPLATE, as for a user message, and it does
not count as a turn. This is TRL's convention for a conversational `prompt`: only
the completion is trained. `start(messages)` does the same for a rollout's opening
messages (which may hold assistant turns, but not end with one).

Templates that are not prefix-preserving. Some templates render earlier turns
differently once the conversation goes on (Qwen3-style templates drop the
`<think>` block of earlier assistant turns). Then the tokens of a later turn's
context are not the tokens the model saw when it wrote an earlier turn. The
renderer detects this (the rendered prefix stops being a prefix) and starts a
new training sample at that turn: `render_samples` returns one trajectory per
consistent stretch, each trained only on assistant turns whose context it holds
exactly as the template renders it. In the new sample, the context (including
the earlier, already trained assistant turns) is PROMPT.

The incremental methods (`start`, `prompt_ids`, `append_sampled`,
`append_message`, `action_text`, `stop_ids`) implement the same
`trajtune.text.render.RendererProtocol` as the toy `Renderer`: an episode's state
(the messages so far, whether the last action stopped) lives in its `Transcript`;
sampled tokens are kept as sampled.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

from ..trajectory import Owner, Trajectory
from .render import Transcript

CACHE_SIZE = 8192
"""renderings kept per renderer (Jinja renders and tokenizer calls repeat: a group's episodes share a prompt)"""

CONTENT_OWNERS = {"system": Owner.PROMPT, "user": Owner.PROMPT, "tool": Owner.TOOL}


class TemplateError(ValueError):
    """A chat template that cannot be tagged (missing, or inconsistent with its generation prompt)."""


class ChatRenderer:
    """Conversations -> trajectories with a Hugging Face tokenizer's chat template (a `RendererProtocol`).

    tokenizer: a `transformers` tokenizer with `chat_template` set.
    tools: tool schemas passed to the template (`apply_chat_template(tools=...)`).
    stop_ids: ids that end an assistant turn (default: eos plus the special token the
      template puts right after assistant content, e.g. `<|im_end|>` or `<|eot_id|>`).
    template_kwargs: extra variables for the template, passed to every `apply_chat_template` call --
      toggleable reasoning (RLHF book ch.7.3) where the template reads them, e.g. `{"enable_thinking": False}`
      (Qwen3) or `{"reasoning_effort": "low"}` (gpt-oss). A variable the template never mentions is a
      TemplateError: it would change nothing, silently.
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, stop_ids: Sequence[int] | None = None,
                 template_kwargs: Mapping[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat_template (a base model?), and every row is rendered with "
                                "the model's own template: use an instruct model, or give this one a template "
                                "(tokenizer.chat_template = '<a Jinja string>'; tokenizer.save_pretrained(DIR) "
                                "writes it to chat_template.jinja)")
        self.tokenizer = tokenizer
        self.tools = tools
        self.template_kwargs = dict(template_kwargs or {})
        source = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
        unread = [k for k in self.template_kwargs if k not in source]
        if unread:
            raise TemplateError(f"the chat template never reads {', '.join(map(repr, unread))}: this model's template "
                                "has no such switch (look for the variable in its tokenizer_config.json chat_template)")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._texts: dict[tuple, str] = {}  # (`_message_key` of each message, generation prompt) -> rendering
        self._pieces: dict = {}  # tokenizations: _tokenize's (text, spans), _encode's text, start's messages
        self._stop_ids = tuple(stop_ids) if stop_ids is not None else self._detect_stop_ids()
        self._stop_texts = [tokenizer.convert_ids_to_tokens(i) for i in self._stop_ids]

    # --- the template, as text
    def text(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool = False) -> str:
        """The template's rendering of `messages` (a string; memoized: a template is a function of
        its messages -- one that reads the clock, like Llama 3's date line, keeps its first reading)."""
        if not messages:
            return ""
        key = (tuple(map(_message_key, messages)), generation_prompt)
        out = self._texts.get(key)
        if out is None:
            out = self.tokenizer.apply_chat_template(list(messages), tools=self.tools, tokenize=False,
                                                     add_generation_prompt=generation_prompt, **self.template_kwargs)
            _remember(self._texts, key, out)
        return out

    def template_ids(self, messages: Sequence[Mapping[str, Any]], generation_prompt: bool = False) -> list[int]:
        """`apply_chat_template(..., tokenize=True)` as a plain list of ids (the reference the tests compare to)."""
        out = self.tokenizer.apply_chat_template(list(messages), tools=self.tools, tokenize=True,
                                                 add_generation_prompt=generation_prompt, **self.template_kwargs)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def _detect_stop_ids(self) -> tuple[int, ...]:
        tok = self.tokenizer
        ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        body = self.text(probe)[len(self.text(probe[:1], True)):]
        after = body[body.find("y") + 1:]
        enc = tok(after, add_special_tokens=False)["input_ids"]
        special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
        for i in enc:
            if i in special:
                if i not in ids:
                    ids.append(i)
                break
        if not ids:
            raise TemplateError("cannot tell which token ends an assistant turn; pass stop_ids=")
        return tuple(ids)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn (pass to the sampler)."""
        return self._stop_ids

    # --- whole conversations
    def render_samples(self, messages: Sequence[Mapping[str, Any]], reward: float = 0.0,
                       info: dict | None = None, context: int = 0) -> list[Trajectory]:
        """Render a conversation into one trajectory, or several where the template is not
        prefix-preserving (see the module docstring). Samples without POLICY tokens are dropped.

        context: the first `context` messages are the prompt; assistant turns among them are
        PROMPT-owned context, never trained (TRL's conversational prompt / completion split)."""
        messages = [dict(m) for m in messages]
        if not messages or messages[0]["role"] == "assistant":
            raise TemplateError("a conversation must start with a system or user message")
        samples: list[tuple[str, list]] = []
        text, spans, n_assistant = "", [], 0  # spans: (start, end, owner, turn)
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                raise TemplateError(f"message {i}: unknown role {role!r} (system, user, assistant or tool)")
            policy = role == "assistant" and i >= context  # a turn the model is trained on
            turn = max(0, n_assistant - (not policy))
            if policy:
                head = self.text(messages[:i], generation_prompt=True)
                full = self.text(messages[: i + 1])
                if not head.startswith(text):  # earlier turns re-rendered: a new sample from here
                    samples.append((text, spans))
                    text, spans = "", [(0, len(head), Owner.PROMPT, turn)]
                else:
                    spans.append((len(text), len(head), Owner.TEMPLATE, turn))
                if not full.startswith(head):
                    raise TemplateError(f"message {i}: the template renders this assistant turn differently from its "
                                        "generation prompt (add_generation_prompt=True); cannot tell what the model "
                                        "writes")
                end = self._policy_end(full, len(head))
                spans += [(len(head), end, Owner.POLICY, turn), (end, len(full), Owner.TEMPLATE, turn)]
                n_assistant += 1
            else:
                full = self.text(messages[: i + 1])
                if not full.startswith(text):
                    samples.append((text, spans))
                    text, spans = "", [(0, len(full), Owner.PROMPT, turn)]
                else:
                    spans += self._content_spans(full, len(text), m, _content_owner(role), turn)
            text = full
        samples.append((text, spans))
        out = [self._tokenize(t, s, reward, info) for t, s in samples if any(o == Owner.POLICY for _, _, o, _ in s)]
        return out

    def render(self, messages: Sequence[Mapping[str, Any]], reward: float = 0.0,
               info: dict | None = None) -> Trajectory:
        """Render a conversation as one trajectory (errors if the template splits it; use render_samples)."""
        samples = self.render_samples(messages, reward, info)
        if len(samples) != 1:
            raise TemplateError(f"the chat template is not prefix-preserving for this conversation: "
                                f"it renders as {len(samples)} training samples (use render_samples)")
        return samples[0]

    def generation_prompt(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids of the template's generation prompt for `messages` (what a sampler continues)."""
        return self.template_ids(messages, generation_prompt=True)

    # --- incremental building (model rollouts)
    def start(self, messages: Iterable[Mapping[str, Any]] = ()) -> Transcript:
        """A new episode's Transcript holding the opening messages (the prompt). Assistant turns among
        them are context (PROMPT-owned, as TRL renders a conversational prompt); the last message must
        not be one: the policy's turn comes next (the generation prompt, `prompt_ids`)."""
        messages = [dict(m) for m in messages]
        if messages and messages[-1].get("role") == "assistant":
            raise TemplateError(f"start: the prompt ends with an assistant turn (message {len(messages) - 1}); "
                                "the model writes the next assistant turn itself, so end the prompt with a user "
                                "(or system / tool) message")
        key = ("start", tuple(map(_message_key, messages)))  # a group's episodes open alike: render once
        opening = self._pieces.get(key)
        if opening is None:
            spans, prev = [], ""
            for i, m in enumerate(messages):
                if m.get("role") not in ("system", "user", "assistant", "tool"):
                    raise TemplateError(f"start: message {i} has role {m.get('role')!r} (system, user, assistant or "
                                        "tool)")
                full = self.text(messages[: i + 1])
                spans += self._content_spans(full, len(prev), m, _content_owner(m["role"]), 0)
                prev = full
            text = self.text(messages)
            header = self._encode(self.text(messages, generation_prompt=True)[len(text):])
            opening = (text, self._tokenize(text, spans, 0.0, None), header)
            _remember(self._pieces, key, opening)
        text, piece, header = opening
        traj = Trajectory(list(piece.ids), list(piece.owners), list(piece.turns))
        n = len(messages)
        return Transcript(traj, messages, memo={(n, False): text, ("header", n): header})

    def prompt_ids(self, transcript: Transcript) -> list[int]:
        """What the sampler continues for the next assistant turn: the ids so far + the generation prompt."""
        return transcript.traj.ids + self._transcript_header(transcript)

    def append_sampled(self, transcript: Transcript, tokens: Sequence[int], logprobs: Sequence[float],
                       turn: int) -> None:
        """Append one sampled assistant turn: generation prompt (TEMPLATE) + tokens as sampled (POLICY)."""
        traj, messages = transcript.traj, transcript.messages
        traj.append(self._transcript_header(transcript), Owner.TEMPLATE, turn)
        traj.append(tokens, Owner.POLICY, turn, logprobs=logprobs)
        messages.append({"role": "assistant", "content": self.action_text(tokens)})
        transcript.stopped = bool(tokens) and tokens[-1] in self.stop_ids

    def append_message(self, transcript: Transcript, message: Mapping[str, Any], turn: int) -> None:
        """Append a system / user / tool message (after a stopped assistant turn: the template's tail first)."""
        role = message["role"]
        if role not in CONTENT_OWNERS:
            raise TemplateError(f"append_message: role {role!r} (expected system, user or tool)")
        traj, messages = transcript.traj, transcript.messages
        before = self._transcript_text(transcript, len(messages))
        full = self.text(messages + [dict(message)])
        if not full.startswith(before):  # the template re-renders earlier turns once this message follows
            raise TemplateError(f"append_message: the chat template renders the conversation differently once this "
                                f"{role} message follows (not prefix-preserving here): the tokens so far would no "
                                "longer be the template's")
        after_stop = bool(messages) and messages[-1]["role"] == "assistant" and transcript.stopped
        transcript.stopped = False
        if after_stop:
            end = self._policy_end(before, len(self._transcript_text(transcript, len(messages) - 1, True)))
            traj.append(self._encode(before[end:]), Owner.TEMPLATE, turn)  # e.g. the "\n" after <|im_end|>
        n = len(before)
        spans = [(s - n, e - n, o, t) for s, e, o, t in self._content_spans(full, n, message, CONTENT_OWNERS[role],
                                                                            turn)]
        piece = self._tokenize(full[n:], spans, 0.0, None)
        for tid, owner in zip(piece.ids, piece.owners, strict=True):
            traj.append([tid], owner, turn)
        messages.append(dict(message))
        transcript.memo[(len(messages), False)] = full

    def action_text(self, tokens: Sequence[int]) -> str:
        """The text of a sampled action: its tokens without the trailing stop token."""
        tokens = list(tokens)
        if tokens and tokens[-1] in self.stop_ids:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    # --- helpers
    def _transcript_text(self, transcript: Transcript, n: int, generation_prompt: bool = False) -> str:
        """`text(transcript.messages[:n], generation_prompt)`, memoized in the transcript (its messages only grow)."""
        key = (n, generation_prompt)
        out = transcript.memo.get(key)
        if out is None:
            out = transcript.memo[key] = self.text(transcript.messages[:n], generation_prompt)
        return out

    def _transcript_header(self, transcript: Transcript) -> list[int]:
        """The generation prompt's ids after the messages so far: what `text(messages, True)` adds to
        `text(messages)` (memoized in the transcript)."""
        n = len(transcript.messages)
        ids = transcript.memo.get(("header", n))
        if ids is None:
            head = self._transcript_text(transcript, n, True)
            ids = transcript.memo[("header", n)] = self._encode(head[len(self._transcript_text(transcript, n)):])
        return list(ids)

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        ids = self._pieces.get(text)
        if ids is None:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            _remember(self._pieces, text, ids)
        return list(ids)

    def _policy_end(self, full: str, start: int) -> int:
        """End (exclusive) of the assistant's own text in `full[start:]`: through the first stop token."""
        hits = [full.find(s, start) for s in self._stop_texts]
        hits = [(h, len(s)) for h, s in zip(hits, self._stop_texts, strict=True) if h >= 0]
        if not hits:
            return len(full)
        h, n = min(hits)
        return h + n

    @staticmethod
    def _content_spans(full: str, start: int, message: Mapping[str, Any], owner: Owner, turn: int) -> list:
        """Spans of one non-assistant message's text `full[start:]`: the content string is `owner`, the rest
        TEMPLATE."""
        content = message.get("content")
        at = full.find(content, start) if isinstance(content, str) and content else -1
        if at < 0:
            return [(start, len(full), owner, turn)]
        end = at + len(content)
        return [(start, at, Owner.TEMPLATE, turn), (at, end, owner, turn), (end, len(full), Owner.TEMPLATE, turn)]

    def _tokenize(self, text: str, spans: list, reward: float, info: dict | None) -> Trajectory:
        """Tokenize `text` once; each token takes the owner and turn of the span holding its first character."""
        key = (text, tuple(spans))
        piece = self._pieces.get(key)
        if piece is None:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ordered = sorted((s for s in spans if s[1] > s[0]), key=lambda s: s[0])
            ids, owners, turns, k = [], [], [], 0
            for tid, (a, _) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
                while k + 1 < len(ordered) and ordered[k][1] <= a:
                    k += 1
                owner, turn = (ordered[k][2], ordered[k][3]) if ordered else (Owner.TEMPLATE, 0)
                ids.append(tid), owners.append(int(owner)), turns.append(turn)
            piece = (ids, owners, turns)
            _remember(self._pieces, key, piece)
        ids, owners, turns = piece
        return Trajectory(list(ids), list(owners), list(turns), reward=reward, info=dict(info or {}))


def _content_owner(role: str) -> Owner:
    """Owner of a non-trained message's content: PROMPT for system / user / context assistant turns, TOOL for tool."""
    return CONTENT_OWNERS.get(role, Owner.PROMPT)


def _message_key(message: Mapping[str, Any]) -> tuple | str:
    """A message as a cache key: its sorted (field, value) pairs when every value is a str (hashing reuses
    each string's cached hash), else their JSON (tool calls, lists of content parts). Only the message's own fields
    are sorted: the order of keys inside a value (a tool call's arguments) is rendered, so it is part of the key."""
    items = tuple(sorted(message.items()))
    if all(type(v) is str for _, v in items):
        return items
    return json.dumps(items, default=str)


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= CACHE_SIZE:  # a simple bound: start over (renderings are cheap to redo)
        cache.clear()
    cache[key] = value
