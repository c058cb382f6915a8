"""Property-based: no JSONL input crashes the dataset loaders with anything but a clear DataError."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from trajtune.sources import data as D  # noqa: E402
from trajtune.models.hf_random import train_tokenizer  # noqa: E402
from trajtune.text.chat import ChatRenderer  # noqa: E402

RENDERER = ChatRenderer(train_tokenizer())
FIELDS = ["messages", "prompt", "completion", "chosen", "rejected", "role", "content", "answer"]
text = st.text(alphabet="abc xyz.?!0123", max_size=8)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), text)
roles = st.sampled_from(["user", "assistant", "assistant", "system", "tool", "robot"])
message = st.fixed_dictionaries({"role": roles, "content": st.one_of(text, text, st.integers())})
conversation = st.lists(message, max_size=4)
turn = st.one_of(text, conversation, scalars)
# files of mostly well-formed rows of one format, with wrong types, roles and fields mixed in
formats = [
    st.fixed_dictionaries({"messages": conversation}),
    st.fixed_dictionaries({"prompt": turn, "completion": turn}),
    st.fixed_dictionaries({"chosen": turn, "rejected": turn}, optional={"prompt": turn}),
    st.fixed_dictionaries({"prompt": turn}, optional={"answer": scalars}),
    st.one_of(st.dictionaries(st.sampled_from(FIELDS), st.one_of(scalars, conversation), max_size=3),
              st.text(max_size=12)),
]
rows = st.one_of([st.lists(f, min_size=1, max_size=3) for f in formats])

@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows)
def test_loaders_either_work_or_raise_a_data_error_naming_the_line(tmp_path_factory, data_rows):
    path = tmp_path_factory.mktemp("fuzz") / "d.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)).replace("\n", " ") + "\n" for r in data_rows))
    for load in (lambda rs: D.sft_trajectories(rs, RENDERER), lambda rs: D.preference_pairs(rs, RENDERER),
                 D.prompt_tasks):
        try:
            load(D.read_rows(path))
        except D.DataError as e:
            assert str(path) in str(e) or "line" in str(e), str(e)
