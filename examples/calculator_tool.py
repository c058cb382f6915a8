"""A tool-calling task end to end with `trajtune.envs.tools.ToolEnv` (RLHF book ch.13): the policy multiplies two
3-digit numbers by calling a `multiply` tool, then answers.

    python examples/calculator_tool.py            # ~1 s; the oracle and the guesser, and one rendered episode

ToolEnv runs the orchestration loop of ch.13.2: an assistant turn with calls (here the Hermes / Qwen JSON layout,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) gets one tool message per call back, tagged with its
tool_call_id; a turn without calls is the final answer, scored by the task's `check`. Two scripted policies play it
through the same episode loop a trainer samples with (`trajtune.sources.rollout.scripted_rollout`): the oracle calls
the tool and copies its result (success 1.0, and its calls match the expected ones exactly: ch.13.6's
`call_match`); the guesser answers at once with a product of rounded numbers (success ~0). The rendered episode
shows the owner of every token: the tool's reply is TOOL-owned, so a loss over POLICY tokens never trains on it.
A learning policy in place of the scripted ones is the RL loop of examples/guess_number.py.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass

from trajtune.envs.tools import Tool, ToolCall, ToolEnv, call_match, parse_tool_calls
from trajtune.sources.rollout import scripted_rollout
from trajtune.text.render import Renderer, format_owners
from trajtune.text.tokenizers import CharTokenizer

MULTIPLY = Tool("multiply", lambda a, b: a * b, {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                 "required": ["a", "b"]})


@dataclass(frozen=True)
class Product:
    """One task: a x b, answered as a number."""

    a: int
    b: int

    @property
    def name(self) -> str:
        return f"{self.a}x{self.b}"

    @property
    def prompt(self) -> str:
        return f"What is {self.a} * {self.b}? Use the multiply tool, then say the number."

    def check(self, answer: str) -> float:
        return float(answer.strip() == str(self.a * self.b))


class Oracle:
    """Calls the tool once, then answers with what it returned."""

    def act(self, messages) -> str:
        if messages[-1]["role"] == "user":
            a, b = map(int, re.findall(r"\d+", messages[-1]["content"]))
            return f'<tool_call>{json.dumps({"name": "multiply", "arguments": {"a": a, "b": b}})}</tool_call>'
        return messages[-1]["content"].rsplit(": ", 1)[-1]  # "[call_0_0] multiply: 56088" -> the number


class Guesser:
    """Answers at once, from the numbers rounded to tens: never calls the tool."""

    def act(self, messages) -> str:
        a, b = (round(int(x), -1) for x in re.findall(r"\d+", messages[-1]["content"]))
        return str(a * b)


def main(n_tasks: int = 20, seed: int = 0, verbose: bool = True) -> dict:
    rng = random.Random(seed)
    tasks = [Product(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(n_tasks)]
    env = ToolEnv([MULTIPLY])
    corpus = [t.prompt for t in tasks] + ['<tool_call>{"name": "multiply", "arguments": {"a": , "b": }}</tool_call>',
                                          "[call_0_0] multiply: 0123456789", "error: unknown tool"]
    renderer = Renderer(CharTokenizer.from_corpus(corpus))
    out = {}
    for name, policy in (("oracle", Oracle()), ("guesser", Guesser())):
        episodes = [scripted_rollout(policy, env, task, renderer, max_turns=3, max_tokens=1024,
                                     max_action_tokens=96) for task in tasks]
        out[name] = sum(t.reward for t in episodes) / len(episodes)
        out[f"{name}_episode"] = episodes[0]
    first = tasks[0]
    said = out["oracle_episode"].info["actions"][0]
    out["call_match"] = call_match(parse_tool_calls(said)[0], [ToolCall("multiply", {"a": first.a, "b": first.b})])
    if verbose:
        print(f"success over {n_tasks} products: oracle {out['oracle']:.2f}, guesser {out['guesser']:.2f}; "
              f"the oracle's first call against the expected one: {out['call_match']}")
        print(format_owners(out["oracle_episode"], renderer.tokenizer))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    main(args.tasks, args.seed)
