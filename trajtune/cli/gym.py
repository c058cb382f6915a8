"""`trajtune gym GYM --policy P`: play a gym with a scripted policy and show what training would see.

    trajtune gym bugfix --policy oracle                     # pass 1.000 on the 20 training tasks
    trajtune gym bugfix --policy blind --episodes-per-task 10 --split heldout
    trajtune gym bugfix --policy random --reward public     # the exploit pays under the public reward
    trajtune gym arithmetic --policy oracle --split heldout
    trajtune gym instruct --policy oracle --reward preference

Prints the pass rate (mean reward), invalid calls per episode, the hack rate
(submitted episodes whose public tests pass and hidden tests fail; BugFix
only), token counts by owner, episodes per second, and one rendered episode
with every token's owner and turn — the exact tokens a trainer would see.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from ..sources.rollout import scripted_rollout
from ..text.render import Renderer, format_owners, owner_counts

ARITHMETIC_TASKS = 64
"""`trajtune gym arithmetic`'s default number of train tasks"""
GYMS = {
    "bugfix": {"policies": ("oracle", "blind", "random"), "rewards": ("hidden", "public")},
    "arithmetic": {"policies": ("oracle", "random"), "rewards": ("exact",)},
    "instruct": {"policies": ("oracle", "random"), "rewards": ("format", "preference")},
}


def add_gym_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `gym` subcommand to an argparse subparsers object (sets `func=run_gym`)."""
    g = subparsers.add_parser("gym", help="play a gym with a scripted policy and show rendered episodes",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("gym", choices=sorted(GYMS), help="which gym")
    g.add_argument("--policy", default="oracle",
                   help="bugfix: oracle|blind|random; arithmetic, instruct: oracle|random")
    g.add_argument("--split", default="train", choices=("train", "heldout", "novel", "renamed"),
                   help="task split (default train; bugfix: heldout = unseen names over the training cues, novel = "
                        "unseen code, renamed = train tasks under held-out names)")
    g.add_argument("--episodes-per-task", type=int, default=1, metavar="N", help="episodes per task (default 1)")
    g.add_argument("--reward", default=None,
                   help="bugfix: hidden (default) | public; instruct: format (default) | preference")
    g.add_argument("--seed", type=int, default=0, help="seed of the scripted policy (episode k uses seed+k)")
    g.add_argument("--tasks", type=int, default=None, metavar="N",
                   help=f"arithmetic train split: number of tasks (default {ARITHMETIC_TASKS}; the other gyms and "
                        "splits have fixed task sets)")
    g.add_argument("--show", type=int, default=0, metavar="I", help="index of the episode to render (default 0)")
    g.add_argument("--max-turns", type=int, default=6, help="policy turns per episode (default 6)")
    g.set_defaults(func=run_gym)
    return g


def run_gym(args) -> int:
    """Run the `gym` subcommand; returns the process exit code."""
    spec = GYMS[args.gym]
    reward = args.reward or spec["rewards"][0]
    if args.policy not in spec["policies"]:
        return _fail(f"gym {args.gym}: unknown policy {args.policy!r}; choose from {', '.join(spec['policies'])}")
    if reward not in spec["rewards"]:
        return _fail(f"gym {args.gym}: unknown reward {reward!r}; choose from {', '.join(spec['rewards'])}")
    if args.episodes_per_task < 1:
        return _fail("--episodes-per-task must be at least 1")
    if args.gym != "bugfix" and args.split not in ("train", "heldout"):
        return _fail(f"gym {args.gym}: --split {args.split} is a bugfix split; choose train or heldout")
    if args.max_turns < 1:
        return _fail(f"--max-turns {args.max_turns}: an episode needs at least 1 policy turn")
    if args.tasks is not None:
        if (args.gym, args.split) != ("arithmetic", "train"):
            return _fail(f"--tasks: sets the number of the arithmetic gym's train tasks; gym {args.gym} --split "
                         f"{args.split} has a fixed task set")
        if args.tasks < 1:
            return _fail(f"--tasks {args.tasks}: needs at least 1 task")
    tasks, make_env, make_policy, tokenizer = _setup(args, reward)
    renderer = Renderer(tokenizer)
    t0 = time.perf_counter()
    trajs = []
    for k in range(args.episodes_per_task):
        policy = make_policy(args.seed + k)
        trajs += [scripted_rollout(policy, make_env(), task, renderer, max_turns=args.max_turns) for task in tasks]
    seconds = time.perf_counter() - t0
    print(summary(args, reward, trajs, len(tasks), tokenizer.vocab_size, seconds))
    if not 0 <= args.show < len(trajs):
        return _fail(f"--show {args.show}: there are {len(trajs)} episodes")
    shown = trajs[args.show]
    print(f"\nepisode {args.show}: task {shown.info['task']}, reward {shown.reward:.1f}, "
          f"actions {shown.info.get('actions', [])}  (t = turn; only policy tokens are trained on)")
    print(format_owners(shown, tokenizer))
    return 0


def _setup(args, reward: str):
    """(tasks, env factory, policy factory seed -> policy, tokenizer) for one gym."""
    from ..envs import scripted

    if args.gym == "bugfix":
        from ..envs.bugfix import BugFixEnv, build_tokenizer
        from ..envs.bugfix_tasks import make_tasks

        return (make_tasks(args.split), lambda: BugFixEnv(reward=reward),
                lambda seed: scripted.bugfix_policy(args.policy, seed), build_tokenizer())
    if args.gym == "arithmetic":
        from ..envs import arithmetic

        policies = {"oracle": scripted.ArithmeticOracle, "random": scripted.ArithmeticRandom}
        n = ARITHMETIC_TASKS if args.tasks is None else args.tasks
        return (arithmetic.make_tasks(args.split, n=n, seed=args.seed), arithmetic.arithmetic_env,
                policies[args.policy], arithmetic.arithmetic_tokenizer())
    from ..envs import instruct

    text = instruct.shakespeare_text()
    demos = instruct.demonstrations(text)
    words = instruct.SEEN if args.split == "train" else instruct.UNSEEN
    tasks = [instruct.InstructTask(w) for w in words]
    if args.policy == "oracle":
        make_policy = lambda seed: scripted.InstructOracle(demos, seed)  # noqa: E731
    else:
        lines = [line for line in text.split("\n") if line and not line.endswith(":")]
        make_policy = lambda seed: scripted.InstructRandom(lines, seed)  # noqa: E731
    return tasks, lambda: instruct.instruct_env(reward), make_policy, instruct.instruct_tokenizer(text)


def summary(args, reward: str, trajs, n_tasks: int, vocab_size: int, seconds: float) -> str:
    """The report block: rates, token counts, speed; BugFix adds hack rate, reads and per-family pass."""
    n = len(trajs)
    mean = lambda xs: sum(xs) / max(1, len(xs))  # noqa: E731
    counts = owner_counts(trajs)
    total = sum(counts.values())
    lines = [
        f"gym {args.gym} | policy {args.policy} | split {args.split} | reward {reward} | "
        f"{n_tasks} tasks x {args.episodes_per_task} episodes (seed {args.seed}) | vocab {vocab_size}",
        f"pass rate        {mean([t.reward for t in trajs]):.3f}",
        f"invalid / ep     {mean([t.info.get('n_invalid', 0) for t in trajs]):.2f}",
    ]
    if args.gym == "bugfix":
        lines += [
            f"hack rate        {mean([t.info['hacked'] for t in trajs]):.3f}   "
            "(submitted; public tests pass, hidden fail)",
            f"hidden pass      {mean([t.info['hidden_pass'] for t in trajs]):.3f} | public pass "
            f"{mean([t.info['public_pass'] for t in trajs]):.3f} | submitted "
            f"{mean([t.info['submitted'] for t in trajs]):.3f}"
            f" | episodes that read {mean([t.info['n_reads'] > 0 for t in trajs]):.2f}",
        ]
        by_family = defaultdict(list)
        for t in trajs:
            by_family[t.info["family"]].append(t.reward)
        lines.append("pass by family   " + "  ".join(f"{f} {mean(r):.2f}" for f, r in by_family.items()))
    lines += [
        "predicted tokens " + ", ".join(f"{k} {v} ({v / max(1, total):.0%})" for k, v in counts.items())
        + f" | total {total}",
        f"speed            {n / max(seconds, 1e-9):.0f} episodes/s ({n} episodes in {seconds:.2f}s)",
    ]
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"trajtune gym: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajtune.cli.gym")
    add_gym_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["gym", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
