"""An agent that learns (issue 42): the `openai`-client agent of examples/openai_agent.py, trained with `trajtune grpo
--agent` on the arithmetic gym's addition problems, on a tiny model on CPU; its held-out success before and after RL.

    python examples/agent_learns.py                    # ~5 min on 2 CPU cores; writes runs/agent-learns/
    python examples/agent_learns.py --grpo-steps 0     # the warm start and its measurement only

A random model cannot call a tool, so the story has a warm start:

 1. make   a random Qwen2-style model (`trajtune.models.hf_random`; its ChatML template renders tools and tool calls
           natively as <tool_call> JSON) with a tokenizer trained on the task's text
 2. sft    `trajtune sft` on demonstrations of two behaviours: half the episodes call the tool (user question -> a
           <tool_call> of `add` -> the tool's result -> the sum), half answer at once with a guess (the numbers
           rounded to tens, summed: rarely right). The SFT'd policy copies numbers into calls well, but calls the
           tool in only about a quarter of the episodes
 3. before the agent's success on held-out problems (the gym's held-out set, never trained on), sampled at the run's
           temperature from fixed seeds, through the same endpoint and agent loop the run uses
 4. grpo   `trajtune grpo --agent examples/openai_agent.py:run` on training problems (the reward: the agent's, 1
           for the right sum): what RL has to find is that calling the tool pays
 5. after  the same measurement of the RL'd model, from the same seeds

Every command it runs is printed; the numbers, their standard errors and the commands go to
runs/agent-learns/summary.json. The demonstrations carry the agent's tools in a `tools` column, which trajtune renders
as the endpoint renders the agent's requests: SFT and RL see the same prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "examples" / "openai_agent.py"
sys.path[:0] = [str(ROOT), str(AGENT.parent)]

from openai_agent import TOOLS, run, task_row  # noqa: E402

from trajtune.envs.arithmetic import heldout_tasks, train_tasks  # noqa: E402

CONCURRENCY = 16
"""agents at once (measure and grpo's --agent-concurrency): the endpoint's listen backlog drops connections of a
burst of hundreds of clients"""


def demonstration(a: int, b: int, use_tool: bool = True) -> dict:
    """The SFT row of a + b: the whole episode, one call of `add` and the answer (a `tools` column: trajtune renders
    it as the endpoint renders the agent's requests); or (use_tool False) a guess at once: the sum of the numbers
    rounded to tens, as examples/calculator_tool.py's Guesser answers (right only where the roundings cancel)."""
    row = task_row(a, b)
    if not use_tool:
        guess = str(round(a, -1) + round(b, -1))
        return {"tools": TOOLS, "messages": [{"role": "user", "content": row["prompt"]},
                                             {"role": "assistant", "content": guess}]}
    call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    return {"tools": TOOLS, "messages": [{"role": "user", "content": row["prompt"]},
                                         {"role": "assistant", "content": "", "tool_calls": [call]},
                                         {"role": "tool", "tool_call_id": "call_0", "content": str(a + b)},
                                         {"role": "assistant", "content": row["answer"]}]}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_model(out: Path, size: str, seed: int) -> Path:
    """A random qwen2 model whose tokenizer was trained on the task's rendered episodes (short prompts)."""
    from trajtune.models.hf_random import DEFAULT_CORPUS, make_random_model, train_tokenizer

    tok = train_tokenizer()
    rows = [demonstration(t.a, t.b) for t in train_tasks(64, seed=seed + 1)]
    corpus = [tok.apply_chat_template(r["messages"], tools=r["tools"], tokenize=False) for r in rows]
    return make_random_model(out, "qwen2", size, seed=seed, corpus=corpus + DEFAULT_CORPUS)


def trajtune(*args: str, log: list[str]) -> None:
    cmd = [sys.executable, "-m", "trajtune", *args]
    shown = "trajtune " + " ".join(shlex.quote(a) for a in args)
    log.append(shown)
    print(f"$ {shown}", flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)


def measure(model: Path, tasks_file: Path, samples: int, seed: int, max_new_tokens: int, max_turns: int) -> dict:
    """The agent's success on the tasks of `tasks_file`, `samples` episodes each, sampled as the run samples
    (temperature 1) through the endpoint, from a fixed seed: mean reward, its standard error, share with a call."""
    import torch

    from trajtune.engine import make_engine
    from trajtune.models.hf import load_policy, load_tokenizer
    from trajtune.sources.base import Draw
    from trajtune.sources.data import prompt_tasks, read_rows
    from trajtune.sources.endpoint.agents import AgentSource
    from trajtune.sources.sampler import SamplerSettings, engine_sampler
    from trajtune.trajectory import Owner

    tokenizer = load_tokenizer(model)
    engine = make_engine(load_policy(model))
    sampler = engine_sampler(engine, SamplerSettings(max_new_tokens), pad_id=tokenizer.pad_token_id)
    source = AgentSource(sampler, tokenizer, run, max_turns=max_turns, max_tokens=1024, concurrency=CONCURRENCY)
    tasks = prompt_tasks(read_rows(tasks_file))
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            trajs = source.take(Draw(tasks, samples, torch.Generator().manual_seed(seed))).trajs
    finally:
        source.close()
    rewards = [t.reward for t in trajs]
    mean = sum(rewards) / len(rewards)
    # the problems are the unit: a problem's success share over its samples, then the mean and its standard error
    per_task = [sum(rewards[i: i + samples]) / samples for i in range(0, len(rewards), samples)]
    se = math.sqrt(sum((p - mean) ** 2 for p in per_task) / (len(per_task) - 1) / len(per_task))
    called = sum(Owner.TOOL in t.owners for t in trajs) / len(trajs)
    return {"success": mean, "se": se, "episodes": len(trajs), "tasks": len(per_task), "tool_called": called,
            "seconds": time.perf_counter() - t0, "per_task": per_task}


def paired_se(before: list[float], after: list[float]) -> float:
    """The standard error of the mean change, problem by problem (the same problems and seeds before and after)."""
    d = [b - a for a, b in zip(before, after, strict=True)]
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "agent-learns")
    ap.add_argument("--model", default="", help="start from this model instead of a random one (a folder or a catalog "
                    "name, e.g. smollm2-135m; its template's tool format, or trajtune's written into the content); "
                    "--sft-steps 0: no SFT")
    ap.add_argument("--size", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demos", type=int, default=2000, help="SFT demonstrations (training problems)")
    ap.add_argument("--tool-share", type=float, default=0.5, help="demonstrations that call the tool (the rest guess)")
    ap.add_argument("--sft-steps", type=int, default=4000)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--grpo-steps", type=int, default=30)
    ap.add_argument("--grpo-lr", type=float, default=5e-4)
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--heldout", type=int, default=256, help="held-out problems measured (the gym's set: <= 256)")
    ap.add_argument("--samples", type=int, default=2, help="episodes per held-out problem")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--max-turns", type=int, default=4)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    t0 = time.perf_counter()

    train = train_tasks(args.demos + 4096, seed=args.seed)
    rl_data = write_jsonl(out / "tasks.jsonl", [task_row(t.a, t.b) for t in train[args.demos:]])
    heldout = write_jsonl(out / "heldout.jsonl", [task_row(t.a, t.b) for t in heldout_tasks()[: args.heldout]])
    if args.model:
        from trajtune.models.hub import resolve_model

        start = resolve_model(args.model)
    else:
        start = make_model(out / "base", args.size, args.seed)
    if args.sft_steps:
        calls = [int((i + 1) * args.tool_share) > int(i * args.tool_share) for i in range(args.demos)]  # interleaved
        sft_data = write_jsonl(out / "sft.jsonl", [demonstration(t.a, t.b, c) for t, c in zip(train, calls)])
        trajtune("sft", "--model", args.model or str(start), "--data", str(sft_data), "--steps", str(args.sft_steps),
                 "--lr", str(args.sft_lr), "--seed", str(args.seed), "--out", str(out / "sft"), "--overwrite",
                 log=log)
        start = out / "sft" / "model"
    settings = (args.samples, 10_000 + args.seed, args.max_new_tokens, args.max_turns)
    before = measure(start, heldout, *settings)
    print(f"before RL: held-out success {before['success']:.3f} +- {before['se']:.3f} "
          f"({before['episodes']} episodes; a tool called in {before['tool_called']:.2f})", flush=True)
    result = {"before": before, "commands": log}
    if args.grpo_steps:
        grpo_from = args.model if args.model and not args.sft_steps else str(start)
        trajtune("grpo", "--model", grpo_from, "--data", str(rl_data),
                 "--agent", f"{AGENT.relative_to(ROOT)}:run", "--steps", str(args.grpo_steps),
                 "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size),
                 "--lr", str(args.grpo_lr), "--max-new-tokens", str(args.max_new_tokens),
                 "--max-turns", str(args.max_turns), "--agent-concurrency", str(CONCURRENCY), "--seed", str(args.seed),
                 "--out", str(out / "grpo"), "--overwrite", log=log)
        after = measure(out / "grpo" / "model", heldout, *settings)
        diff, diff_se = after["success"] - before["success"], paired_se(before["per_task"], after["per_task"])
        print(f"after RL:  held-out success {after['success']:.3f} +- {after['se']:.3f} "
              f"(a tool called in {after['tool_called']:.2f}); change {diff:+.3f} +- {diff_se:.3f} (paired)",
              flush=True)
        result.update(after=after, change=diff, change_se=diff_se)
    result["seconds"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['seconds']:.0f} s; {out / 'summary.json'}")
    return result


if __name__ == "__main__":
    main()
