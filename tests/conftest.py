import os

# TRL's trainers post usage telemetry from a background thread (huggingface_hub.send_telemetry): no network
# here, and a thread left running makes later stage runs spawn their workers instead of forking them
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest
import torch

from trajtune.models.tiny import TinyConfig, TinyTransformer


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4, max_len=64)).eval()
