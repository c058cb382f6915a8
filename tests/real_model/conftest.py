"""The real-model tier: every practitioner command on a pretrained model (SmolLM2-135M-Instruct, a dequantized
Q4_1 GGUF: `trajtune models fetch smollm2-135m`), a few steps each, on the CPU.

Every test under tests/real_model/ carries the `real_model` marker (added here at collection), which the default
`addopts` leaves out: `pytest -m real_model tests/real_model` runs the tier. Where the model is not fetched, every
test in it skips with the command that fetches it; nothing is ever downloaded from here."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FETCH = "the real model is not fetched: run `trajtune models fetch smollm2-135m`"
def real_model_dir() -> Path | None:
    """The converted model's folder, or None where it is not fetched (never downloads)."""
    from trajtune.models.hub import cached_model

    return cached_model("smollm2-135m")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker must be on the items by then
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session", autouse=True)
def real_model() -> Path:
    """The real model's folder; every test of the tier skips, naming the fetch command, where it is absent."""
    path = real_model_dir()
    if path is None:
        pytest.skip(FETCH)
    return Path(path)


@pytest.fixture(autouse=True)
def _release_memory():
    """After each test: collect the models it left in reference cycles (a TRL trainer, a run's engine) and hand the
    freed memory back to the system, so the tier's process stays near one test's peak (a 135M model in fp32 is
    0.54 GB; with its gradient and AdamW state 2.2 GB)."""
    yield
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
