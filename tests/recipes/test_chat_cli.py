"""`trajtune chat --model DIR` on a tiny random Llama: the reply is sampled from exactly the prompt the
chat template renders and stops at the template's stop token; --prompt / stdin print one reply each; the
REPL keeps the conversation until /reset; a missing or broken model directory is one clear line."""

import io
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time

import pytest
pytest.importorskip("transformers")

from trajtune.cli.chat import Chat, Settings, repl  # noqa: E402
from trajtune import cli  # noqa: E402
from trajtune.models.hf import load_policy, load_tokenizer  # noqa: E402
from trajtune.models.hf_random import make_random_model  # noqa: E402
from trajtune.engine.decoding import sample  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_random_model(tmp_path_factory.mktemp("chat") / "model", "llama", "tiny")


@pytest.fixture(scope="module")
def parser():
    return cli.build_parser()


@pytest.fixture
def main(parser, monkeypatch):
    """`trajtune.cli.main`, building the (slow: every HF command's flags) parser once per module."""
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return cli.main


def expected_reply(path, messages, max_new_tokens=6) -> str:
    """Greedy: the template's generation prompt, continued until the template's stop token."""
    tok, policy = load_tokenizer(path), load_policy(path).eval()
    r = ChatRenderer(tok)
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    out = sample(policy, [ids], max_new_tokens, greedy=True, stop_ids=list(r.stop_ids), pad_id=r.pad_id)
    return r.action_text(out.tokens[0])


def test_prompts_print_one_reply_each_from_the_training_template(model, main, capsys):
    args = ["chat", "--model", str(model), "--temperature", "0", "--max-new-tokens", "6", "--jsonl",
            "--system", "be brief", "--prompt", "What is 2+3?", "--prompt", "hello"]
    assert main(args) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["prompt"] for x in lines] == ["What is 2+3?", "hello"]
    for x in lines:  # each prompt a fresh conversation: system + user
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": x["prompt"]}]
        assert x["reply"] == expected_reply(model, msgs)
    assert main(args[:-6] + ["--backend", "generate"] + args[-6:]) == 0  # HF generate: the same greedy replies
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == lines


def test_stdin_lines_when_stdin_is_not_a_terminal(model, main, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is 2+3?\n\nhi there\n"))
    assert main(["chat", "--model", str(model), "--temperature", "0", "--max-new-tokens", "6", "--jsonl"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["prompt"] for x in lines] == ["What is 2+3?", "hi there"]  # the blank line skipped
    assert lines[1]["reply"] == expected_reply(model, [{"role": "user", "content": "hi there"}])


class Recorder:
    """A sampler (made for each turn's settings) that records its prompts and always answers 'ok' + the first stop
    token."""

    def __init__(self, renderer):
        self.renderer, self.prompts, self.stops = renderer, [], []

    def __call__(self, settings):
        return self

    def sample(self, prompts, stop_ids, seeds):
        from trajtune.engine.decoding import Samples

        self.prompts += prompts
        self.stops.append(stop_ids)
        ok = self.renderer.tokenizer("ok", add_special_tokens=False)["input_ids"]
        return Samples([ok + [stop_ids[-1]]], [[0.0] * (len(ok) + 1)], [True])


def typing(*lines):
    """input() that returns `lines`, then raises EOFError (Ctrl-D)."""
    typed = iter(lines)

    def read(prompt):
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    return read


def test_the_repl_keeps_the_conversation_until_reset(model):
    r = ChatRenderer(load_tokenizer(model))
    rec = Recorder(r)
    chat = Chat(r, rec, Settings(), context=512)
    out = io.StringIO()
    assert repl(chat, None, str(model), typing("first", "second", "/reset", "third", "/nope"), out) == 0
    user = lambda t: {"role": "user", "content": t}  # noqa: E731
    said = {"role": "assistant", "content": "ok"}
    assert rec.prompts == [r.generation_prompt([user("first")]),
                           r.generation_prompt([user("first"), said, user("second")]),
                           r.generation_prompt([user("third")])]
    assert r.tokenizer.convert_tokens_to_ids("<|im_end|>") in rec.stops[0]
    text = out.getvalue()
    assert text.count("model> ok") == 3 and "(conversation cleared)" in text and "commands:" in text


def test_a_full_context_is_a_message_not_a_crash(model):
    r = ChatRenderer(load_tokenizer(model))
    rec = Recorder(r)
    chat = Chat(r, rec, Settings(), context=8)
    out = io.StringIO()
    assert repl(chat, None, "m", typing("a message longer than eight tokens", "/quit"), out) == 0
    assert "fills the model's context" in out.getvalue() and rec.prompts == []


def broken_dirs(model, root):
    """name -> (model directory, text the error must name)."""
    cases = {"missing": (root / "nope", "no such directory")}
    bad_json = root / "bad_json"
    shutil.copytree(model, bad_json)
    (bad_json / "config.json").write_text('{"model_type": "llama", ')
    cases["broken config.json"] = (bad_json, "config.json")
    weights = root / "truncated"
    shutil.copytree(model, weights)
    with open(weights / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    cases["truncated weights"] = (weights, "model.safetensors")
    no_template = root / "no_template"
    shutil.copytree(model, no_template)
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    (no_template / "chat_template.jinja").unlink(missing_ok=True)
    cases["no chat template"] = (no_template, "chat_template")
    return cases


def test_broken_model_directories_and_options_are_one_clear_line(model, main, tmp_path, capsys):
    cases = {name: (["--model", str(d)], what) for name, (d, what) in broken_dirs(model, tmp_path).items()}
    cases["device"] = (["--model", str(model), "--device", "gpu0"], "--device")
    cases["temperature"] = (["--model", str(model), "--temperature", "-1"], "--temperature")
    for name, (args, what) in cases.items():
        assert main(["chat", *args, "--prompt", "hi"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("trajtune: error:") and what in err and "Traceback" not in err, (name, err)


def test_the_repl_on_a_terminal(model):
    """Drive `trajtune chat` through a pseudo-terminal: a prompt, a reply, /reset, /quit."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trajtune", "chat", "--model", str(model), "--temperature", "0",
                             "--max-new-tokens", "6"], stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    seen = b""

    def until(text: bytes, timeout: float = 60.0) -> None:
        nonlocal seen
        end = time.time() + timeout
        while text not in seen:
            assert time.time() < end, seen.decode(errors="replace")
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break
        assert text in seen, seen.decode(errors="replace")

    try:
        until(b"you> ")
        os.write(leader, b"What is 2+3?\n")
        until(b"model> ")
        os.write(leader, b"/reset\n")
        until(b"(conversation cleared)")
        os.write(leader, b"/quit\n")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    assert b"Traceback" not in seen
