"""`trajtune sft|dpo|grpo|rm|rft --model DIR --data FILE` end to end on a tiny random Qwen2 model:
metrics move the right way, the result loads with AutoModelForCausalLM, and the command line is
the recipe path (the same config and the same numbers as a TOML recipe)."""

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from transformers import AutoModelForCausalLM  # noqa: E402

from trajtune.cli import load_recipe, main  # noqa: E402
from trajtune.metrics import is_documented, read_metrics  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("hfcli")
    make_random_model(d / "model", "qwen2", "tiny")
    with open(d / "chats.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i}+5?"},
                                             {"role": "assistant", "content": f"the answer is {i + 5}"}]}) + "\n")
    with open(d / "pairs.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"what is {i}+5?", "chosen": f"{i + 5}", "rejected": "hello world"}) + "\n")
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}],
                                "answer": str(i + 5)}) + "\n")
    (d / "rewards.py").write_text(
        "def has_digit(prompts, completions, answer, **kw):\n"
        "    return [float(any(ch.isdigit() for ch in c[-1]['content'])) for c in completions]\n")
    return d


def _run(*args):
    assert main(list(args)) == 0


def _loads(path):
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()


def test_sft_lowers_the_loss_and_saves_a_loadable_model(work):
    out = work / "sft"
    _run("sft", "--model", str(work / "model"), "--data", str(work / "chats.jsonl"), "--steps", "8", "--lr", "3e-3",
         "--batch-size", "4", "--micro-batch-size", "2", "--save-every", "4", "--out", str(out))
    rows = read_metrics(out)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"] - 0.5
    assert all(is_documented(k) for r in rows for k in r if k not in ("step", "time", "stage"))
    _loads(out / "model")
    _loads(out / "checkpoints" / "step-4")


def test_dpo_with_lora_raises_the_margin(work):
    out = work / "dpo"
    _run("dpo", "--model", str(work / "model"), "--data", str(work / "pairs.jsonl"), "--steps", "6", "--lr", "3e-3",
         "--lora-r", "8", "--out", str(out))
    rows = read_metrics(out)
    assert rows[-1]["dpo/margin"] > rows[0]["dpo/margin"] and rows[-1]["dpo/accuracy"] == 1.0
    _loads(out / "model")
    assert (out / "model" / "adapter" / "adapter_config.json").exists()


def test_grpo_with_a_reward_function(work):
    out = work / "grpo"
    _run("grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"),
         "--reward", f"{work / 'rewards.py'}:has_digit", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
         "--max-new-tokens", "6", "--lr", "1e-3", "--kl-coef", "0.05", "--out", str(out))
    rows = read_metrics(out)
    assert len(rows) == 2 and "rollout/reward" in rows[0] and "kl/k3" in rows[-1]
    assert all(is_documented(k) for r in rows for k in r if k not in ("step", "time", "stage"))
    _loads(out / "model")


def test_rm_and_rft_run(work, capsys):
    capsys.readouterr()
    _run("rm", "--model", str(work / "model"), "--data", str(work / "pairs.jsonl"), "--steps", "1", "--lr", "1e-3",
         "--out", str(work / "rm"))
    assert (work / "rm" / "model" / "value_head.safetensors").exists()
    said = capsys.readouterr()
    assert "rm: 1 optimizer step; model saved to" in said.out  # one step, singular
    assert "unchanged" not in said.out + said.err and "The saved model is its input" not in said.err
    change = json.loads((work / "rm" / "rm" / "results.json").read_text())["weight_change"]
    assert 0 < change["changed"] <= change["tensors"] and change["l2"] > 0 and 0 < change["relative"] < 1
    assert f"(1 optimizer step; weights changed: {change['changed']} of {change['tensors']} tensors, |Δw| = " in (
        work / "rm" / "report.md").read_text()
    _run("rft", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--backend", "generate",
         "--reward", f"{work / 'rewards.py'}:has_digit", "--rounds", "1", "--steps", "2", "--group-size", "2",
         "--max-new-tokens", "4", "--threshold", "0.0", "--out", str(work / "rft"))
    assert read_metrics(work / "rft")[-1]["rft/sampled"] == 8
    text = (work / "rft" / "report.md").read_text()  # RFT records per round: said in rounds, view linked
    assert "Episodes of stage rft were recorded at round 1 only, of the 1 round it ran. The first 4 of round 1:" in text
    assert (work / "rft" / "view.html").exists() and "[view.html](view.html)" in text


def test_errors_are_clear(work, capsys):
    assert main(["sft", "--model", str(work / "missing"), "--data", str(work / "chats.jsonl")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["dpo", "--model", str(work / "model"), "--data", str(work / "chats.jsonl"),
                 "--out", str(work / "x")]) == 2
    assert "chats.jsonl:1: a 'messages' row, but this command needs 'preference'" in capsys.readouterr().err
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl")]) == 2
    assert "needs a reward source: --reward module:function" in capsys.readouterr().err


def test_the_recipe_runs_the_same_config(work):
    module, config, _ = load_recipe(__import__("trajtune.cli").cli.resolve_recipe("hf_sft"),
                                    [f"config.model.path='{work / 'model'}'", f"config.data='{work / 'chats.jsonl'}'",
                                     "config.sft.steps=2"])
    report = module.run(config, work / "recipe")
    assert report.exists() and (work / "recipe" / "model" / "config.json").exists()


def _weights(path):
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).state_dict()


@pytest.mark.parametrize("lora", [[], ["--lora-r", "8"]], ids=["full", "lora"])
def test_ctrl_c_then_the_same_command_resumes_exactly(work, monkeypatch, capsys, lora):
    """GRPO with a KL reference (a saved copy; with LoRA the adapters switched off): a Ctrl-C (a real SIGINT, sent to
    the trainer from inside the reward function's worker process) saves state; rerunning the command finishes with
    the uninterrupted run's weights."""
    (work / "interrupting.py").write_text(
        "import os, signal\ncalls = [0]\n"
        "def graded(prompts, completions, answer, **kw):  # differs between samples: every step has a gradient\n"
        "    calls[0] += 1\n"
        "    if os.environ.get('TT_INTERRUPT_AT') == str(calls[0]):\n"
        "        os.kill(os.getppid(), signal.SIGINT)  # the trainer: the function runs in its worker process\n"
        "    return [sum(ord(ch) % 3 for ch in c[-1]['content']) / 8 for c in completions]\n")
    args = ["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"),
            "--reward", f"{work / 'interrupting.py'}:graded", "--steps", "3", "--prompts-per-step", "2",
            "--group-size", "2", "--max-new-tokens", "4", "--lr", "1e-3", *lora, "--kl-coef", "0.1"]
    tag = "-lora" if lora else ""
    _run(*args, "--out", str(work / f"whole{tag}"))
    monkeypatch.setenv("TT_INTERRUPT_AT", "2")  # while step 2 is scored (one call per batch)
    whole, cut = work / f"whole{tag}", work / f"cut{tag}"
    assert main(args + ["--out", str(cut)]) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
    resume = cut / "grpo" / "resume"  # the stage's resume state (trajtune.runs.stages layout)
    assert not (cut / "model").exists() and (resume / "state" / "engine.json").exists()
    assert (resume / "reference" / ("adapters_off" if lora else "model.safetensors")).exists()
    monkeypatch.delenv("TT_INTERRUPT_AT")
    assert main(args[:-2] + ["--kl-coef", "0.2", "--out", str(cut)]) == 2  # other settings: refused
    assert "--kl-coef 0.1 -> 0.2" in capsys.readouterr().err
    _run(*args, "--out", str(cut))
    assert read_metrics(whole)[-1]["kl/k3"] > 0  # the policy moved away from its reference
    a, b = _weights(whole / "model"), _weights(cut / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
                          for r in rows]
    assert strip(read_metrics(cut)) == strip(read_metrics(whole))


def test_the_command_line_and_a_recipe_are_the_same_run(work, tmp_path):
    """`trajtune grpo --flags` and `trajtune run` on the TOML recipe that sets the same leaves: the same
    resolved config, the same metrics and the same weights."""
    from trajtune.cli import build_parser
    from trajtune.cli.hf import config_from_args

    flags = ["--model", str(work / "model"), "--data", str(work / "prompts.jsonl"),
             "--reward", f"{work / 'rewards.py'}:has_digit", "--steps", "2", "--prompts-per-step", "2",
             "--group-size", "2", "--surrogate", "ppo", "--epochs", "2", "--kl-coef", "0.05", "--length-buckets", "2",
             "--max-new-tokens", "4", "--lr", "1e-3", "--micro-batch-size", "2"]
    recipe = tmp_path / "grpo.toml"
    recipe.write_text(f'''experiment = "hf_grpo"
[config]
data = "{work / 'prompts.jsonl'}"
reward = ["{work / 'rewards.py'}:has_digit"]
[config.model]
path = "{work / 'model'}"
micro_batch_size = 2
[config.rl]
steps = 2
tasks_per_step = 2
group_size = 2
surrogate = "ppo"
epochs = 2
kl_coef = 0.05
length_buckets = 2
[config.sampling]
max_new_tokens = 4
[config.optim]
lr = 1e-3
''')
    from trajtune.experiments.hf.grpo import GRPORun

    from_flags = config_from_args(build_parser().parse_args(["grpo", *flags]), GRPORun)
    _, from_recipe, _ = load_recipe(recipe)
    assert from_flags == from_recipe and from_flags.rl.advantage == "grpo"  # the HF defaults on both routes
    _run("grpo", *flags, "--out", str(tmp_path / "cli"))
    _run("run", str(recipe), "--run-dir", str(tmp_path / "toml"))
    assert (json.loads((tmp_path / "cli" / "config.json").read_text())
            == json.loads((tmp_path / "toml" / "config.json").read_text()))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
                          for r in rows]
    rows = strip(read_metrics(tmp_path / "cli"))
    assert len(rows) == 2 and rows == strip(read_metrics(tmp_path / "toml"))
    a, b = _weights(tmp_path / "cli" / "model"), _weights(tmp_path / "toml" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_grpo_run_that_learned_nothing_says_so(work, capsys):
    """A constant reward: no group has reward variance, so nothing is learned; a 3-token budget cuts the random
    model's completions. The report's first screen names the settings and the reward and warns, one line each,
    shows what the policy sampled at the first and last recorded steps, and links view.html; the terminal ends with
    the same warnings on stderr, the saved model found equal to its input."""
    (work / "const.py").write_text("def one(prompts, completions, **kw):\n    return [1.0 for _ in completions]\n")
    out = work / "grpo-const"
    capsys.readouterr()
    _run("grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"),
         "--reward", f"{work / 'const.py'}:one", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
         "--max-new-tokens", "3", "--lr", "1e-3", "--out", str(out))
    said = capsys.readouterr()
    assert "grpo: 2 optimizer steps; model saved (unchanged from its input) to" in said.out
    warned = [line for line in said.err.splitlines() if line.startswith("trajtune: warning: ")]
    assert said.err.rstrip().endswith(warned[-1]) and [w.split(":")[2].strip() for w in warned] == [
        "No learning signal", "Most completions were cut at the token budget", "The loss never moved",
        "Gradient norm 0 at every step", "The saved model is its input, unchanged"]
    assert "**" not in said.err and "`" not in said.err  # terminal text, not markdown
    change = json.loads((out / "grpo" / "results.json").read_text())["weight_change"]
    assert change["changed"] == 0 and change["tensors"] > 0 and change["l2"] == 0
    rows = read_metrics(out)
    assert ([r["rollout/no_signal_share"] for r in rows] == [1.0, 1.0]
            and all(r["rollout/truncated_share"] > 0.5 for r in rows))
    text = (out / "report.md").read_text()
    first = text.split("## Every plotted metric")[0]
    assert f"reward: `{work / 'const.py'}:one`" in first
    assert "settings: lr 0.001; steps 2; prompts per step 2; group size 4; loss advantage grpo" in first
    assert "max new tokens 3" in first
    assert ("**No learning signal:** at every one of the 2 steps, every group's completions got the same reward "
            "(mean reward 1; `rollout/no_signal_share` 1)") in first
    assert "**Most completions were cut at the token budget:**" in first
    assert "| groups with no reward variance | `rollout/no_signal_share` | 2 | 1 | 1 | 1 | 1 | 1 |" in first
    assert "last logged row" not in text and "{'" not in text  # no raw dict of the last row
    assert "(2 optimizer steps; weights unchanged: all" in first
    assert ("Episodes of stage grpo were recorded at steps 1 and 2, of the 2 steps it ran. "
            "The first 4 of steps 1 and 2:") in first
    samples = [line for line in first.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(samples) == 8 and all("| what is " in line and "| 1 | cut at the token budget |" in line
                                     for line in samples)
    assert (out / "view.html").exists() and "[view.html](view.html)" in first
    assert "- learning rate: `train/lr` 0.001 (constant) at all 2 logged steps (1 to 2)" in text
    assert not (out / "report-lr.png").exists() and not (out / "report-loss.png").exists()  # values, not flat lines
    # a run with signal and room to finish: no such warning (test_grpo_with_a_reward_function's run)
    if (work / "grpo" / "report.md").exists():
        assert "**No learning signal:**" not in (work / "grpo" / "report.md").read_text()
