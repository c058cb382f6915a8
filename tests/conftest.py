"""The test suite's tiers, a folder each (pyproject's `testpaths`, the one list: a new test file picks one, and
tests/unit/test_tiers.py checks), and the fixtures every tier shares.

    unit/         pure functions, losses, parsing, rendering, verdicts, static checks: fast
    loops/        engines and models, sources, every training loop on tiny models, resume, faults, the run machinery
    recipes/      reduced recipe and experiment runs, the commands end to end (`trajtune sft|grpo|...`, chat, gym)
    distributed/  several processes: 2-process gloo runs, and (marker `torchrun`) whole recipes under torchrun
    real_model/   every command on SmolLM2-135M (marker `real_model`, added by its conftest)

Markers (pyproject's [tool.pytest.ini_options]) take out of the default run what needs more than the CPU and the
`test` extra, or takes long: `slow`, `vllm`, `torchrun`, `real_model`; `.ci/run` runs each (README, "Tests").
A test module imports another's helpers by module name (`from test_algorithms import engine`): every tier folder is
on sys.path, so that works whichever tiers the two live in, and with one tier run alone (`pytest tests/loops`)."""

import os
import sys

# TRL's trainers post usage telemetry from a background thread (huggingface_hub.send_telemetry): no network
# here, and a thread left running makes later stage runs spawn their workers instead of forking them
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest
import torch

from trajtune.models.tiny import TinyConfig, TinyTransformer


def pytest_configure(config):
    for tier in reversed(config.getini("testpaths")):
        if str(config.rootpath / tier) not in sys.path:
            sys.path.insert(0, str(config.rootpath / tier))


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_len=64)).eval()


@pytest.fixture(scope="module", autouse=True)
def reports_are_clean_html(tmp_path_factory):
    """After each test module: every report.html written under the session's temporary directory since
    the module began (by a test's tmp_path or a module fixture's tmp_path_factory) parses with only the
    tags a report makes, all closed (`html_problems`): text that went through as HTML fails here."""
    import time

    from trajtune.runs.report import html_problems

    base, start = tmp_path_factory.getbasetemp(), time.time() - 1.0
    yield
    bad = []
    for root, _, files in os.walk(base):
        if "report.html" in files:
            page = os.path.join(root, "report.html")
            if os.path.getmtime(page) >= start:
                with open(page, encoding="utf-8") as f:
                    bad += [f"{page}: {p}" for p in html_problems(f.read())]
    if bad:
        pytest.fail("report.html with bad tags:\n" + "\n".join(bad[:20]), pytrace=False)
