"""Every recipe runs under torchrun: `torchrun --nproc-per-node 2 -m trajtune run RECIPE` (2 gloo CPU
processes) gives the one-process run's results, metrics and final weights, to float tolerance.

Each case is a reduced recipe (a few steps of every stage) written as a TOML file and run through the
real command line twice: once under `python -m torch.distributed.run --standalone --nproc-per-node 2`
and once as one process. Both sample every episode from its own generator (`episode_seeds`, implied
under torchrun: each rank samples its share of the episodes and all-gathers them), so the same
episodes are drawn whichever process draws them.

Why not bitwise: each rank computes half of every batch and the gradients are summed in a different
order, so float32 rounding differs in the last bits (tests/distributed/test_distributed.py measures it); Adam
turns rounding noise on zero-gradient coordinates into steps of ~lr, so weights are compared with a
bound on the share of coordinates that differ, as there.

Why an evaluation share may differ by one episode after a stage's first step: an episode sampled at
temperature 1 maps one uniform draw through the policy's distribution, so weights that differ in the last
bits pick another token when the draw falls that close to a boundary. Measured on an AMD EPYC VM: the agent's
oracle_sft evaluation at step 6 read the source in 14 of 20 episodes under torchrun and 15 of 20 in one
process (eval/read_share 0.70 vs 0.75), every loss, count and weight bound agreeing; on an Intel VM the
same case agreed exactly. At a stage's first step (equal weights) every number is still compared exactly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.torchrun  # a tier of its own (~2 min): `pytest -m torchrun`, run by .ci/run

ROOT = Path(__file__).resolve().parents[2]
FIRST_TOL = 1e-5  # a stage's first step: only the rounding of one forward / backward
TOL = 1e-3
"""later steps: the weights drift apart by Adam's rounding noise, ~3x a step (measured: template_mismatch's
grad norm 4e-6 at its first step, then 1.1e-5, 2.5e-5, 6.9e-5, 2.4e-4 relative); training counts stay exact
because the same episodes are sampled from the shared generators, and an evaluation share may move by one
sampled episode (`one_episode`, see above)"""
GRAD_NORM_TOL = 5e-3
"""later steps' gradient norm, the metric that moves most with those few drifted coordinates: measured 1.6e-3
relative at the agent's hacking stage, step 2 (one SFT step at lr 3e-3 after a first step that agreed to 1e-5;
its loss agreed to 1.6e-4); a real divergence moves the loss and the weights' bound below as well"""


def toml(table: dict, prefix: str = "") -> str:
    """A nested dict of scalars and lists as TOML (enough for recipes)."""
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    out = [f"[{prefix}]"] if prefix and scalars else []
    out += [f"{k} = {json.dumps(v)}" for k, v in scalars.items()]
    for k, v in table.items():
        if isinstance(v, dict):
            out.append(toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)


def launch(args: list[str], run_dir: Path, processes: int, out_flag: str = "--run-dir") -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] \
        if processes > 1 else [sys.executable]
    return subprocess.run([*launcher, "-m", "trajtune", *args, out_flag, str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def run_cli(args: list[str], run_dir: Path, processes: int, out_flag: str = "--run-dir") -> None:
    proc = launch(args, run_dir, processes, out_flag)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def both(tmp_path: Path, args: list[str], out_flag: str = "--run-dir") -> tuple[Path, Path]:
    one, two = tmp_path / "one", tmp_path / "two"
    run_cli(args, one, 1, out_flag)
    run_cli(args, two, 2, out_flag)
    return one, two


def close(a, b, where: str, tol: float = TOL, one_episode: dict[str, float] | None = None) -> None:
    """JSON-like values equal, numbers to `tol` (relative for large ones); an evaluation share named in
    `one_episode` may differ, in a record past step 0, by the share one sampled episode is worth there."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        one_episode = (one_episode or {}) if a.get("step", 1) != 0 else {}
        for k in a:
            if k != "time" and not k.startswith("time/"):  # wall-clock numbers
                flip = one_episode.get(k, 0.0)
                close(a[k], b[k], f"{where}.{k}", max(tol, flip + 1e-9), one_episode)
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{where}[{i}]", tol, one_episode)
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol) or (math.isnan(a) and math.isnan(b)), f"{where}: {a} vs {b}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")} for r in rows]
    return sorted(rows, key=lambda r: (r.get("stage", ""), r["step"], sorted(r)))


def check_same_run(one: Path, two: Path, lr: float, one_episode: dict[str, float] | None = None) -> None:
    stages = sorted(p.parent.name for p in one.glob("*/results.json"))
    assert stages and stages == sorted(p.parent.name for p in two.glob("*/results.json"))
    for stage in stages:  # (paths inside the results name their own run directory)
        close(json.loads((one / stage / "results.json").read_text().replace(str(one), "RUN")),
              json.loads((two / stage / "results.json").read_text().replace(str(two), "RUN")), stage,
              one_episode=one_episode)
    rows_one, rows_two = metric_rows(one), metric_rows(two)
    assert [(r.get("stage"), r["step"]) for r in rows_one] == [(r.get("stage"), r["step"]) for r in rows_two]
    first = {}
    for i, (a, b) in enumerate(zip(rows_one, rows_two, strict=True)):
        at_start = first.setdefault(a.get("stage"), a["step"]) == a["step"]
        where = f"metrics.jsonl: stage {a.get('stage')} step {a['step']}"
        if at_start:
            close(a, b, where, FIRST_TOL)
            continue
        close({k: v for k, v in a.items() if k != "train/grad_norm"},
              {k: v for k, v in b.items() if k != "train/grad_norm"}, where, TOL, one_episode)
        close(a.get("train/grad_norm"), b.get("train/grad_norm"), f"{where}.train/grad_norm", GRAD_NORM_TOL)
    weights = sorted(p.relative_to(one) for p in one.glob("**/model.safetensors") if "resume" not in p.parts)
    assert weights and weights == sorted(p.relative_to(two) for p in two.glob("**/model.safetensors")
                                         if "resume" not in p.parts)
    for w in weights:
        a, b = load_file(str(one / w)), load_file(str(two / w))
        diff = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
        print(f"{w}: max |weight diff| {float(diff.max()):.1e}, {int((diff > 1e-5).sum())} of {diff.numel()} > 1e-5")
        # Adam turns rounding noise on a zero-gradient coordinate into a step of ~lr, so a few coordinates
        # may be a few steps apart (measured 3.3e-4 at lr 1e-3 in the agent's sft_rl; the agent's hacking
        # stage, whose gradient is clipped from norm ~9: 5.1e-3 at lr 3e-3 on 1.9% of the coordinates, with
        # every count equal and the loss to 1.6e-4); a real divergence moves many coordinates (and the
        # metrics above)
        assert float(diff.max()) < 3 * lr and int((diff > 1e-5).sum()) <= 0.03 * diff.numel(), w


AGENT = {
    "experiment": "agent", "description": "reduced: a few steps of every stage kind",
    "config": {
        "episode_seeds": True, "eval_samples": 1, "describe_samples": 1, "probe_group": 2, "pair_samples": 4,
        "cold_start_step": 3, "hack_rounds": 1,
        "weak": {"steps": 12, "batch_size": 16}, "oracle": {"steps": 6, "batch_size": 20, "eval_every": 3},
        "rft": {"rounds": 1, "samples_per_task": 2, "steps_per_round": 2, "batch_size": 8},
        "dpo": {"steps": 3, "eval_every": 3}, "rl": {"steps": 5, "tasks_per_step": 2, "group_size": 4, "eval_every": 5},
    },
}

CHAPTER13 = {
    "experiment": "chapter13", "description": "reduced: every stage, a few steps each",
    "config": {
        "runner": {"workers": 1}, "dim": 32, "n_layers": 1, "val_windows": 16, "adherence_samples": 1, "max_reply": 16,
        "bon_ns": [2], "bon_repeats": 1, "eval_per_word": 1, "dpo_betas": [0.1], "calc_dim": 32, "calc_layers": 1,
        "pass_k": 2, "pretrain": {"steps": 8}, "sft": {"steps": 4}, "reward_model": {"steps": 3}, "dpo": {"steps": 2},
        "coldstart": {"steps": 6}, "rl": {"steps": 2, "tasks_per_step": 4, "group_size": 4}, "control": {"steps": 2},
    },
}


AGENT_SHARES = {"eval/pass_rate": 1 / 20, "eval/read_share": 1 / 20, "eval/heldout_pass_rate": 1 / 10}
"""the agent evaluates 1 sampled episode of each of its 20 train and 10 held-out tasks (eval_samples 1)"""


@pytest.mark.parametrize("recipe, lr, one_episode", [(AGENT, 3e-3, AGENT_SHARES), (CHAPTER13, 3e-3, None)],
                         ids=["agent", "chapter13"])
def test_a_reduced_recipe_under_torchrun_equals_one_process(recipe, lr, one_episode, tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(toml(recipe) + "\n")
    one, two = both(tmp_path, ["run", str(path)])
    check_same_run(one, two, lr, one_episode)


@pytest.fixture(scope="module")
def hf_work(tmp_path_factory):
    pytest.importorskip("transformers")
    from trajtune.models.hf_random import make_random_model

    d = tmp_path_factory.mktemp("hf")
    make_random_model(d / "model", "qwen2", "tiny")
    with open(d / "chats.jsonl", "w") as f:
        for i in range(6):  # 6 rows, batches of 5: ranks get 3 and 2 rows
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i}+5?"},
                                             {"role": "assistant",
                                              "content": f"the answer is {i + 5}" + "!" * i}]}) + "\n")
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}],
                                "answer": str(i + 5)}) + "\n")
    (d / "rewards.py").write_text("def digits(prompts, completions, answer, **kw):\n"
                                  "    return [sum(ch.isdigit() for ch in c[-1]['content']) / 4 "
                                  "for c in completions]\n")
    return d


AGENT = """
import openai

def run(task, base_url, session):
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=list(task.prompt)).choices[0].message
    return sum(ch.isdigit() for ch in reply.content or "") / 4
"""


@pytest.mark.parametrize("command", ["sft", "grpo", "agent"])
def test_a_hugging_face_command_under_torchrun_equals_one_process(command, hf_work, tmp_path):
    """sft, grpo, and grpo --agent (each rank serves its share of the agents on an endpoint of its own)."""
    d = hf_work
    lr = 3e-3
    args = [command.replace("agent", "grpo"), "--model", str(d / "model"), "--lr", str(lr), "--steps", "3",
            "--save-every", "3"]
    if command == "agent":
        (d / "agent.py").write_text(AGENT)
        args += ["--data", str(d / "prompts.jsonl"), "--agent", f"{d / 'agent.py'}:run", "--prompts-per-step", "3",
                 "--group-size", "3", "--max-new-tokens", "6"]
    elif command == "sft":
        args += ["--data", str(d / "chats.jsonl"), "--batch-size", "5", "--length-buckets", "2"]
    else:
        args += ["--data", str(d / "prompts.jsonl"), "--reward", f"{d / 'rewards.py'}:digits",
                 "--prompts-per-step", "3", "--group-size", "3", "--max-new-tokens", "6", "--surrogate", "ppo",
                 "--epochs", "2", "--kl-coef", "0.05"]
    one, two = both(tmp_path, args, out_flag="--out")
    check_same_run(one, two, lr)


def test_the_run_directory_policy_under_torchrun(tmp_path):
    """Rank 0 decides what an earlier run in the directory means and every rank hears it: a changed config on a
    finished run is refused once, on every rank, changing nothing; with the rerun it names, the stage runs again
    on both ranks and rank 0 alone rewrites config.json."""
    run_dir = tmp_path / "run"
    base = ["run", "addition", "--set", "config.sft.steps=2", "--set", "config.n_eval=16"]
    run_cli(base, run_dir, 1)
    results = (run_dir / "sft" / "results.json").read_bytes()
    proc = launch([*base, "--set", "config.sft.steps=3"], run_dir, 2)
    assert proc.returncode != 0 and proc.stderr.count("trajtune: error:") == 1, proc.stderr[-3000:]
    assert "sft.steps 2 -> 3" in proc.stderr and """--set 'config.runner.rerun=["sft"]'""" in proc.stderr
    assert (run_dir / "sft" / "results.json").read_bytes() == results
    run_cli([*base, "--set", "config.sft.steps=3", "--set", 'config.runner.rerun=["sft"]'], run_dir, 2)
    assert json.loads((run_dir / "config.json").read_text())["sft"]["steps"] == 3
    assert json.loads((run_dir / "sft" / "results.json").read_text())["curve"][-1][0] == 3
