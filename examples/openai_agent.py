"""A tool-using agent written with the `openai` client, trained by `trajtune grpo --agent` (issue 42): it reads an
addition problem of the arithmetic gym (`trajtune.envs.arithmetic`), calls an `add` tool, reads the tool's result and
answers with a number.

    # the agent against any OpenAI-compatible server (here trajtune's own, over a model folder):
    trajtune endpoint --model runs/agent-learns/sft/model --port 8000 &
    python examples/openai_agent.py --base-url http://127.0.0.1:8000/v1 --tasks 4

    # RL of the agent: the rows of tasks.jsonl are the tasks ('prompt', 'answer'), the agent returns the reward
    trajtune grpo --model runs/agent-learns/sft/model --data runs/agent-learns/tasks.jsonl \\
        --agent examples/openai_agent.py:run --max-turns 4 --max-new-tokens 40 --out runs/agent-grpo

    # the whole story on a tiny model (make, SFT on demonstrations, measure, GRPO, measure): ~5 min on 2 CPU cores
    python examples/agent_learns.py

Nothing here is trajtune's: it is the loop an agent written for any OpenAI-compatible server runs. The run gives it a
`base_url` per episode (the session is in the URL, so every request of the episode lands in one recorded trajectory)
and trains on the tokens the model sampled; the tool's results are the agent's, so the trainer never trains on them.

The reward: 1.0 when the final reply (the first one without tool calls) says the sum -- its last integer is the sum,
so "68" and "23 + 45 = 68." both count -- else 0.0. It is not shaped: a correct tool call earns nothing by itself; a
policy learns to call the tool because answering from the tool's result is how it gets the sum right.
"""

from __future__ import annotations

import argparse
import json
import re

import openai

ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [ADD]
MAX_CALLS = 4
"""model replies per episode before the agent gives up (reward 0); the run's --max-turns should allow as many"""


def call_tool(name: str, arguments: str) -> str:
    """Run one tool call (arguments: the JSON text the model wrote) -> the tool message's content; a bad call gets an
    error text back, as a real harness would answer it."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as e:
        return f"error: arguments are not JSON ({e.msg})"
    if name != "add":
        return f"error: no tool {name!r}"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    a, b = args.get("a"), args.get("b")
    if not isinstance(a, int) or not isinstance(b, int) or isinstance(a, bool) or isinstance(b, bool):
        return "error: add takes two integers a and b"
    return str(a + b)


def solve(client: openai.OpenAI, prompt: str) -> tuple[str, list[dict]]:
    """The agent's loop: ask, run the tool calls it gets back, ask again, until a reply has no tool calls (the
    answer). Returns (the answer, the conversation); the answer is "" when the model never stops calling tools."""
    messages: list[dict] = [{"role": "user", "content": prompt}]
    for _ in range(MAX_CALLS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            messages.append({"role": "assistant", "content": message.content or ""})
            return (message.content or "").strip(), messages
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [c.model_dump() for c in message.tool_calls]})
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": call_tool(call.function.name, call.function.arguments)})
    return "", messages


def answer_of(reply: str) -> str:
    """The number a final reply gives: its last integer ("" where it has none)."""
    numbers = re.findall(r"-?\d+", reply)
    return numbers[-1] if numbers else ""


def run(task, base_url: str, session: str) -> float:
    """One episode for `trajtune grpo --agent examples/openai_agent.py:run`: task is a row of the data ('prompt' and
    'answer' columns), base_url the endpoint of this episode; returns the reward."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        answer, _ = solve(client, task.prompt)
    except openai.BadRequestError as e:  # the run's turn or token limit refused the next request: not solved
        if e.code in ("turn_limit", "context_length_exceeded"):
            return 0.0
        raise
    return float(answer_of(answer) == str(task.columns["answer"]))


def task_row(a: int, b: int) -> dict:
    """The data row of the problem a + b (the tasks file of `trajtune grpo --data`)."""
    return {"prompt": f"What is {a} + {b}?", "answer": str(a + b)}


if __name__ == "__main__":
    from trajtune.envs.arithmetic import heldout_tasks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--tasks", type=int, default=4, help="problems of the arithmetic gym's held-out set to try")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    for t in heldout_tasks()[: args.tasks]:
        row = task_row(t.a, t.b)
        answer, conversation = solve(client, row["prompt"])
        print(json.dumps(conversation))
        print(f"{row['prompt']} -> {answer!r}: {'solved' if answer_of(answer) == row['answer'] else 'not solved'}")
