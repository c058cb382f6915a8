"""The renderer: the one place where conversations become tokens.

Every trajectory in trajtune — a scripted demonstration, a model rollout, a
preference pair — is turned into token ids by this module, so the policy is
trained on exactly the format it is sampled in (seed ch.15 §15.6 measures what
a mismatch costs: train pass 0.98 -> 0.075).

Format (wrappers on, the default)::

    <bos>                                      TEMPLATE  turn 0
    <|user|> fix the bug in clamp <|end|>      TEMPLATE PROMPT.. TEMPLATE
    <|assistant|> read <|end|>                 TEMPLATE POLICY.. POLICY
    <|tool|> def clamp ( ... <|end|>           TEMPLATE TOOL..   TEMPLATE

Owners: system/user content is PROMPT, tool content TOOL, assistant content
POLICY. The `<|end|>` that closes an *assistant* message is POLICY too: the
policy must learn to stop, and it is the sampler's stop token. Every other
wrapper token (`<bos>`, `<|role|>` headers, `<|end|>` closing non-assistant
messages) is TEMPLATE.

Turn index (`Trajectory.turns`): assistant message k (0-based) and everything
after it up to the next assistant message — the observation it caused — is
turn k. Everything before the first assistant message (`<bos>`, system, the
first user message) is turn 0 as well. So turn k = (action k, observation k),
and a trajectory with K assistant messages has turns 0..K-1. In formulas:
turn(token) = max(0, number of assistant messages started at or before it - 1).

`wrappers=False` drops every TEMPLATE token except the leading `<bos>` (the
assistant's closing `<|end|>` stays: it is POLICY). It exists for the template
mismatch experiment (REPRODUCE.md A11); nothing else should use it.

Messages are dicts `{"role": "system" | "user" | "assistant" | "tool", "content": str}`.

The seam: `RendererProtocol` is what rollouts and loops need of a renderer. Two
classes implement it, `Renderer` here (toy tokenizers) and
`trajtune.text.chat.ChatRenderer` (a Hugging Face tokenizer's chat template).
While a model samples an episode, the renderer's state for it lives in a
`Transcript` (the trajectory so far, the messages so far, whether the last
action stopped), never in `Trajectory.info`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Literal, Mapping, Protocol, Sequence

from ..trajectory import Owner, Trajectory
from .tokenizers import ASSISTANT, BOS, END, SYSTEM, TOOL, USER, Tokenizer

Message = Mapping[str, str]
ROLES: dict[str, tuple[str, Owner]] = {
    "system": (SYSTEM, Owner.PROMPT),
    "user": (USER, Owner.PROMPT),
    "assistant": (ASSISTANT, Owner.POLICY),
    "tool": (TOOL, Owner.TOOL),
}
OWNER_NAMES = {int(o): o.name.lower() for o in Owner}
ENCODED_CACHE = 8192
"""texts whose token ids a `Renderer` keeps (observations and prompts repeat across a rollout's episodes)"""


@dataclass
class Transcript:
    """One episode's rendering while a model samples it: the renderer's per-episode state.

    `start(messages)` makes one; `prompt_ids`, `append_sampled` and `append_message`
    read and extend it. The rollout keeps it while the episode runs and hands on only
    `traj`, so a finished Trajectory carries none of this bookkeeping.
    """

    traj: Trajectory
    """ids / owners / turns (and the sampler's logprobs on POLICY tokens) so far"""
    messages: list[dict[str, str]] = field(default_factory=list)
    """the conversation so far (a sampled action as its `action_text`)"""
    stopped: bool = False
    """the last sampled assistant turn ended with a stop token (ChatRenderer then appends
    what its template writes after the stop token before the next message)"""
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    """the renderer's memo of renderings of `messages[:n]`, keyed by n (ChatRenderer: template text
    and the generation prompt's ids), so a turn renders its history once: `messages` only grows"""


class RendererProtocol(Protocol):
    """The contract of a renderer: what rollouts (rollout.py) and the loops use of one. No base class.

    Implemented by `Renderer` (toy tokenizers, this module) and
    `trajtune.text.chat.ChatRenderer` (Hugging Face chat templates). Each must give the
    same tokens both ways in: rendering a finished conversation, and building it turn
    by turn in a `Transcript` while a model samples (tests/unit/test_render.py,
    tests/unit/test_chat_template.py and tests/loops/test_rollout.py check that they agree).
    """

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn (the sampler's `stop_ids`)."""
        ...

    def render(self, messages: Sequence[Message], reward: float = 0.0, info: dict | None = None) -> Trajectory:
        """A finished conversation -> one Trajectory (ids, owners, turns), with `reward` and a copy of `info`."""
        ...

    def generation_prompt(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of `messages` followed by the assistant header: what a sampler continues."""
        ...

    def start(self, messages: Iterable[Message] = ()) -> Transcript:
        """A new episode's Transcript holding the opening (system / user) messages, all turn 0."""
        ...

    def prompt_ids(self, transcript: Transcript) -> list[int]:
        """What the sampler continues for the next assistant turn: the ids so far + the assistant
        header (equal to `generation_prompt(transcript.messages)` when sampled actions decode exactly)."""
        ...

    def append_sampled(self, transcript: Transcript, tokens: Sequence[int], logprobs: Sequence[float],
                       turn: int) -> None:
        """Append one sampled assistant turn as turn `turn`: the header (TEMPLATE), then `tokens` exactly
        as sampled (POLICY, with their `logprobs`; the stop token if one was sampled, none invented), and
        the assistant message `action_text(tokens)` to `transcript.messages` (the text the rollout gives
        the environment)."""
        ...

    def append_message(self, transcript: Transcript, message: Message, turn: int) -> None:
        """Append one system / user / tool message (an observation) to turn `turn`; an assistant
        message is an error (those are sampled: `append_sampled`)."""
        ...

    def action_text(self, tokens: Sequence[int]) -> str:
        """The text an environment sees for a sampled action: `tokens` without a trailing stop token."""
        ...


class Renderer:
    """Turns messages into a `Trajectory` (ids, owners, turns) with one tokenizer (a `RendererProtocol`).

    Two ways in, one format out:
      * `render(messages)` renders a finished conversation (scripted episodes,
        demonstrations, preference pairs);
      * `start` / `prompt_ids` / `append_sampled` / `append_message` build the same
        trajectory incrementally in a `Transcript` while a model samples (rollout.py).
    tests/unit/test_render.py checks the two agree token for token.
    """

    def __init__(self, tokenizer: Tokenizer, wrappers: bool = True):
        self.tokenizer = tokenizer
        self.wrappers = wrappers
        self.bos_id = tokenizer.special_id(BOS)
        self.end_id = tokenizer.special_id(END)
        self.header_ids = {role: tokenizer.special_id(name) for role, (name, _) in ROLES.items()}
        self._encoded: dict[str, list[int]] = {}  # text -> ids (observations repeat: "ok", a task's source listing)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn (pass to the sampler)."""
        return (self.end_id,)

    # --- whole conversations ----------------------------------------------------
    def render(self, messages: Iterable[Message], reward: float = 0.0, info: dict | None = None) -> Trajectory:
        """Render a conversation; every assistant message is closed by a POLICY `<|end|>`."""
        traj = Trajectory(reward=reward, info=dict(info or {}))
        traj.append([self.bos_id], Owner.TEMPLATE, 0)
        n_assistant = 0
        for message in messages:
            if message["role"] == "assistant":
                self._append_header(traj, "assistant", n_assistant)
                traj.append(self._encode(message["content"]) + [self.end_id], Owner.POLICY, n_assistant)
                n_assistant += 1
            else:
                self._append_message(traj, message, max(0, n_assistant - 1))
        return traj

    def generation_prompt(self, messages: Iterable[Message]) -> list[int]:
        """Token ids of the history followed by the assistant header: what the sampler continues."""
        return self.render(messages).ids + self._assistant_header()

    # --- incremental building (model rollouts) -----------------------------------
    def start(self, messages: Iterable[Message] = ()) -> Transcript:
        """A new episode: `<bos>` plus the given (non-assistant) messages, all turn 0."""
        messages = [dict(m) for m in messages]
        return Transcript(self.render(messages), messages)

    def prompt_ids(self, transcript: Transcript) -> list[int]:
        """What the sampler continues for the next assistant turn: the ids so far + assistant header."""
        return transcript.traj.ids + self._assistant_header()

    def append_sampled(self, transcript: Transcript, tokens: Sequence[int], logprobs: Sequence[float],
                       turn: int) -> None:
        """Append one sampled assistant turn: header (TEMPLATE) + tokens as sampled (POLICY, with logprobs).

        `tokens` include the stop token if the sampler produced one; if it ran out
        of budget the turn simply has no `<|end|>` (the trajectory records what the
        model actually saw and wrote).
        """
        self._append_header(transcript.traj, "assistant", turn)
        transcript.traj.append(tokens, Owner.POLICY, turn, logprobs=logprobs)
        transcript.messages.append({"role": "assistant", "content": self.action_text(tokens)})
        transcript.stopped = bool(tokens) and tokens[-1] in self.stop_ids

    def append_message(self, transcript: Transcript, message: Message, turn: int) -> None:
        """Append one non-assistant message: header, content, `<|end|>` (TEMPLATE around the content)."""
        self._append_message(transcript.traj, message, turn)
        transcript.messages.append(dict(message))

    def action_text(self, tokens: Sequence[int]) -> str:
        """The text of a sampled action: its tokens without the trailing stop token.

        Special tokens inside an action are decoded by name (e.g. `<|user|>`), so an
        environment sees them and treats the action as malformed.
        """
        tokens = list(tokens)
        if tokens and tokens[-1] in self.stop_ids:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens)

    def _append_message(self, traj: Trajectory, message: Message, turn: int) -> None:
        role = message["role"]
        if role not in ROLES or role == "assistant":
            raise ValueError(f"append_message: role {role!r} (expected system, user or tool)")
        self._append_header(traj, role, turn)
        traj.append(self._encode(message["content"]), ROLES[role][1], turn)
        if self.wrappers:
            traj.append([self.end_id], Owner.TEMPLATE, turn)

    def _encode(self, text: str) -> list[int]:
        """`tokenizer.encode(text)`, memoized (a tokenizer is a function of the text; at most ENCODED_CACHE texts)."""
        ids = self._encoded.get(text)
        if ids is None:
            if len(self._encoded) >= ENCODED_CACHE:  # a simple bound: start over
                self._encoded.clear()
            ids = self._encoded[text] = self.tokenizer.encode(text)
        return list(ids)

    def _assistant_header(self) -> list[int]:
        return [self.header_ids["assistant"]] if self.wrappers else []

    def _append_header(self, traj: Trajectory, role: str, turn: int) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {sorted(ROLES)}")
        if self.wrappers:
            traj.append([self.header_ids[role]], Owner.TEMPLATE, turn)


def format_owners(traj: Trajectory, tokenizer: Tokenizer, width: int = 100) -> str:
    """Show a trajectory as runs of tokens with their owner and turn, one run per line.

    Example line: `t0 policy   | read <|end|>`. Newlines inside a run are shown as
    `\\n` so each run stays on one line; long runs are cut at `width` characters.
    """
    lines = []
    start = 0
    n = len(traj)
    for i in range(1, n + 1):
        if i == n or traj.owners[i] != traj.owners[start] or traj.turns[i] != traj.turns[start]:
            text = tokenizer.decode(traj.ids[start:i]).replace("\n", "\\n")
            if len(text) > width:
                text = text[: width - 3] + "..."
            lines.append(f"t{traj.turns[start]} {OWNER_NAMES[traj.owners[start]]:<8} | {text}")
            start = i
    return "\n".join(lines)


def owner_counts(trajectories: Iterable[Trajectory], predicted_only: bool = True) -> dict[str, int]:
    """Token counts by owner; `predicted_only` skips each trajectory's first token (it is never predicted)."""
    counts = {name: 0 for name in OWNER_NAMES.values()}
    for traj in trajectories:
        for owner in traj.owners[1 if predicted_only else 0 :]:
            counts[OWNER_NAMES[owner]] += 1
    return counts


TrainOn = Literal["all", "last", "unroll"]
"""Which assistant turns of a multi-turn conversation are trained (RLHF book ch.4.4; `select_turns`)."""


def select_turns(samples: Sequence[Trajectory], mode: TrainOn = "all") -> list[Trajectory]:
    """One conversation's rendered samples -> the samples to train on, by which assistant turns are trained
    (RLHF book ch.4.4, multi-turn masking):

        all      every assistant turn (the samples unchanged; the default)
        last     the final assistant turn only: the POLICY tokens of every earlier turn become PROMPT
                 (context the model reads, never trained); a sample without the final turn is dropped
        unroll   one sample per assistant turn k: the conversation up to the end of turn k's POLICY tokens
                 (later turns cut off), turn k trained and every earlier turn PROMPT

    `samples` are what a renderer gave for ONE conversation (`Renderer.render` -> [traj];
    `ChatRenderer.render_samples` -> one or several, with global turn numbers). A turn's POLICY tokens are
    the assistant's content and its stop token; the template's header before them stays TEMPLATE. Applying
    a mode to its own output changes nothing (each output sample trains one turn). Sampler log-probs are
    kept on the tokens kept."""
    if mode not in ("all", "last", "unroll"):
        raise ValueError(f"select_turns: mode must be 'all', 'last' or 'unroll', got {mode!r}")
    if mode == "all":
        return list(samples)
    trained = sorted({t for s in samples for t, o in zip(s.turns, s.owners, strict=True) if o == Owner.POLICY})
    wanted = trained[-1:] if mode == "last" else trained
    out = []
    for k in wanted:
        sample = next(s for s in samples if any(t == k and o == Owner.POLICY for t, o in zip(s.turns, s.owners,
                                                                                             strict=True)))
        end = len(sample)
        if mode == "unroll":  # cut after turn k's last POLICY token
            end = max(i for i, (t, o) in enumerate(zip(sample.turns, sample.owners, strict=True))
                      if t == k and o == Owner.POLICY) + 1
        owners = [int(Owner.PROMPT) if o == Owner.POLICY and t != k else o
                  for t, o in zip(sample.turns[:end], sample.owners[:end], strict=True)]
        out.append(replace(sample, ids=sample.ids[:end], owners=owners, turns=sample.turns[:end],
                           logprobs=None if sample.logprobs is None else sample.logprobs[:end],
                           info=dict(sample.info)))
    return out
