"""TRL parity on the real model: tests/loops/test_hf_trl_parity.py's checks (token-exact ids and trained-token masks
against `apply_chat_template` and TRL 1.16's own trainers, the loss, and the gradient of the SFT, DPO and GRPO
losses on the same weights) collected here with `model_dir` the real model (SmolLM2-135M-Instruct: its ChatML
template with a default system turn, eos = pad = <|im_end|>)."""

import pytest

pytest.importorskip("trl")

from test_hf_trl_parity import (  # noqa: E402, F401 - collected here, with this module's fixtures
    test_dpo_scores_the_completion_only_as_trl_does,
    test_grpo_prompt_with_an_assistant_turn_renders_as_trl_does,
    test_sft_prompt_completion_trains_the_completion_only_as_trl_does,
)

from trajtune.models.hf import load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(real_model):
    return real_model


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)
