"""`trajtune chat --model DIR`: talk to a trained Hugging Face model with the template and stop tokens it was
trained with.

    trajtune chat --model runs/grpo/model                         # a REPL on a terminal: /reset, /quit, Ctrl-D
    trajtune chat --model runs/grpo/model --prompt "What is 2+3?" --prompt "What is 7+8?"   # one reply each
    printf 'What is 2+3?\\nWhat is 7+8?\\n' | trajtune chat --model runs/grpo/model        # one reply per line
    trajtune chat --model DIR --temperature 0.7 --seed 1 --system "Answer briefly." --max-new-tokens 64

What the model sees is what training rendered: the model directory's own tokenizer and chat template
through `trajtune.text.chat.ChatRenderer` (the renderer every HF command trains and samples with), the
generation prompt after the conversation so far, and sampling stops at the renderer's stop tokens (eos and
the token the template puts after an assistant turn, e.g. `<|im_end|>`). Sampling is the engine's
KV-cached sampler (`--backend sampler`, what grpo / rft sample with), `model.generate` (`--backend
generate`) or vLLM (`--backend vllm`, `trajtune.sources.vllm`); `--temperature 0` is greedy.

In the REPL the conversation is kept (each reply becomes an assistant turn of the next prompt) until
/reset; /quit, /exit or Ctrl-D leave; Ctrl-C while the model writes drops that reply. Non-interactive
prompts (`--prompt`, or stdin lines when stdin is not a terminal) are independent one-turn conversations,
one reply printed per prompt (a reply that spans lines is printed as it is; `--jsonl` prints one JSON
object per prompt instead).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, TextIO

from ..config import ConfigError
from ..sources.sampler import Sampler, SamplerSettings

COMMANDS = ("/reset", "/quit", "/exit", "/help")


def add_chat_parser(subparsers) -> None:
    """Add `chat` to the `trajtune` subcommands."""
    p = subparsers.add_parser("chat", help="HF model: talk to a trained model (its own chat template and stop tokens)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="MODEL", help="a local Hugging Face model folder (e.g. "
                   "runs/sft/model), a hub id (org/name), a .gguf file or a catalog name (smollm2-135m; "
                   "`trajtune models list`)")
    p.add_argument("--prompt", action="append", metavar="TEXT",
                   help="a prompt to answer and exit (repeatable; each one a fresh conversation). Without it: "
                        "a REPL on a terminal, else one prompt per stdin line")
    p.add_argument("--system", metavar="TEXT", help="a system message opening every conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="reply budget in tokens (default 256)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0: off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--backend", choices=("sampler", "generate", "vllm"), default="sampler",
                   help="trajtune's KV-cached sampler (as grpo / rft sample), HF model.generate, or vLLM (installed: "
                        "README) on the saved weights (default sampler)")
    p.add_argument("--device", default="cpu", help='torch device ("cpu", "cuda", "cuda:1", "mps"; default cpu)')
    p.add_argument("--jsonl", action="store_true", help='non-interactive: print {"prompt": ..., "reply": ...} lines')
    p.set_defaults(func=cmd_chat)


@dataclass
class Settings:
    """How replies are sampled."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    backend: str = "sampler"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")


@dataclass
class Chat:
    """A loaded model and its renderer; `reply(messages)` samples the next assistant turn."""

    renderer: object
    make_sampler: Callable[[SamplerSettings], Sampler]
    """a `trajtune.sources.sampler.Sampler` with a turn's settings (its budget: what the context leaves): the
    engine's decoder of --backend, or vLLM's"""
    settings: Settings
    context: int
    generator: object = field(default=None)
    """one torch.Generator for the session: replies differ turn to turn, the session repeats with --seed"""
    stopped: bool = True
    """whether the last reply ended with a stop token (False: it ran out of --max-new-tokens or context)"""

    def reply(self, messages: list[dict]) -> str:
        """The assistant's next turn after `messages` (text without the stop token)."""
        import torch

        from ..text.chat import TemplateError

        try:
            prompt = self.renderer.generation_prompt(messages)
        except TemplateError as e:
            raise ConfigError(f"the chat template cannot render this conversation: {e}") from e
        s = self.settings
        budget = min(s.max_new_tokens, self.context - len(prompt))
        if budget < 1:
            raise ConversationTooLong(f"the conversation ({len(prompt)} tokens) fills the model's context "
                                      f"({self.context} tokens)")
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(s.seed)
        turn = SamplerSettings(budget, s.temperature or 1.0, top_p=s.top_p, greedy=s.temperature == 0)
        out = self.make_sampler(turn).sample([prompt], list(self.renderer.stop_ids), self.generator)
        self.stopped = bool(out.stopped[0])
        return self.renderer.action_text(out.tokens[0])


class ConversationTooLong(ConfigError):
    """The next prompt leaves no room in the model's context for a reply."""


def load_chat(model_dir: str, settings: Settings) -> Chat:
    """Load tokenizer, chat template and model from `model_dir`; every failure a ConfigError naming it."""
    from ..models.hf import ModelPathError, check_model_dir, load_policy, load_tokenizer
    from ..text.chat import ChatRenderer, TemplateError

    device = check_device(settings.device)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar between the user and the reply
    except ImportError:  # pragma: no cover
        pass
    try:
        model_dir = str(check_model_dir(model_dir))  # a hub id / .gguf / catalog name -> its folder, once
        tokenizer = load_tokenizer(model_dir)
        renderer = ChatRenderer(tokenizer)
        policy = None if settings.backend == "vllm" else load_policy(model_dir)  # vLLM loads its own copy
    except (ModelPathError, TemplateError) as e:
        raise ConfigError(f"{model_dir}: {e}" if str(model_dir) not in str(e) else str(e)) from e
    except Exception as e:  # a damaged file the loaders do not name (weights, tokenizer files)
        from pathlib import Path

        weights = sorted(p.name for p in Path(model_dir).glob("*.safetensors")) or ["no *.safetensors file"]
        raise ConfigError(f"{model_dir}: cannot load the model's weights ({', '.join(weights)}): "
                          f"{type(e).__name__}: {e}") from e
    if settings.backend == "vllm":  # vLLM's engine on the saved weights (the trainer's sampler: sources.vllm)
        from ..experiments.hf.prepare import model_context
        from ..sources.build import make_sampler
        from ..sources.vllm import Colocated

        context = model_context(model_dir)
        client = Colocated(model_dir, dtype="auto", max_model_len=context)
        return Chat(renderer, make_sampler("vllm", None, client=client), settings, context or 1 << 30)
    assert policy is not None
    from ..engine import make_engine
    from ..sources.build import make_sampler

    engine = make_engine(policy, device=device)
    return Chat(renderer, make_sampler(settings.backend, engine, pad_id=renderer.pad_id), settings, policy.max_len)


def check_device(name: str):
    """`name` as a torch.device, refused (before the model loads) as every HF command refuses it."""
    import torch

    from ..experiments.hf.recipe import check_device as check

    check(name)
    return torch.device(name)


def opening(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


def answer_each(chat: Chat, prompts: Iterable[str], system: str | None, out: TextIO, jsonl: bool) -> int:
    """Non-interactive: one fresh conversation and one printed reply per prompt."""
    for prompt in prompts:
        reply = chat.reply(opening(system) + [{"role": "user", "content": prompt}])
        print(json.dumps({"prompt": prompt, "reply": reply}) if jsonl else reply, file=out, flush=True)
    return 0


def repl(chat: Chat, system: str | None, model_dir: str, read: Callable[[str], str] = input,
         out: TextIO = sys.stdout) -> int:
    """The interactive loop: the conversation is kept until /reset; /quit, /exit or EOF (Ctrl-D) leave."""
    print(f"trajtune chat: {model_dir} (stop tokens {list(chat.renderer.stop_ids)}; {chat.settings.backend}, "
          f"{'greedy' if chat.settings.temperature == 0 else f'temperature {chat.settings.temperature:g}'}). "
          "/reset starts over, /quit or Ctrl-D leaves.", file=out, flush=True)
    messages = opening(system)
    while True:
        try:
            line = read("you> ")
        except EOFError:
            print(file=out)
            return 0
        except KeyboardInterrupt:
            print(file=out)
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            messages = opening(system)
            print("(conversation cleared)", file=out, flush=True)
            continue
        if text.startswith("/"):
            print(f"commands: {', '.join(COMMANDS)}; anything else is your message", file=out, flush=True)
            continue
        turn = messages + [{"role": "user", "content": text}]
        try:
            reply = chat.reply(turn)
        except ConversationTooLong as e:
            print(f"({e}; /reset to start over)", file=out, flush=True)
            continue
        except KeyboardInterrupt:
            print("\n(reply dropped)", file=out, flush=True)
            continue
        messages = turn + [{"role": "assistant", "content": reply}]
        cut = "" if chat.stopped else "  [no stop token: cut at the token budget]"
        print(f"model> {reply}{cut}", file=out, flush=True)


def cmd_chat(args) -> int:
    settings = Settings(args.max_new_tokens, args.temperature, args.top_p, args.seed, args.backend, args.device)
    interactive = args.prompt is None and sys.stdin.isatty()
    if args.jsonl and interactive:
        raise ConfigError("--jsonl is for non-interactive use (--prompt, or prompts on stdin)")
    chat = load_chat(args.model, settings)
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover
            pass
        return repl(chat, args.system, args.model)
    prompts = args.prompt if args.prompt is not None else (line.rstrip("\n") for line in sys.stdin if line.strip())
    try:
        return answer_each(chat, prompts, args.system, sys.stdout, args.jsonl)
    except KeyboardInterrupt:
        return 130
