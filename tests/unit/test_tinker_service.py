"""The Tinker service's plumbing without a model: request order (Sequencer), futures, the registry."""

from __future__ import annotations

import threading
import time

import pytest

from trajtune.tinker.futures import Futures, Result
from trajtune.tinker.models import Sequencer
from trajtune.tinker.registry import Registry


def run_all(seq: Sequencer, order: list[int], gap_s: float | None = None) -> list[int]:
    done: list[int] = []
    finished = threading.Event()

    def work(i: int):
        def go():
            done.append(i)
            if len(done) == len(order):
                finished.set()
        return go

    for i in order:
        seq.submit(i, work(i))
    assert finished.wait(10)
    return done


def test_requests_run_in_seq_id_order_whatever_order_they_arrive_in():
    seq = Sequencer("t", gap_s=5.0)
    gate = threading.Event()
    seq.submit(1, gate.wait)  # holds the worker while 4, 2, 3 arrive
    done: list[int] = []
    all_done = threading.Event()
    for i in (4, 2, 3):
        seq.submit(i, lambda i=i: (done.append(i), len(done) == 3 and all_done.set()))
    gate.set()
    assert all_done.wait(10) and done == [2, 3, 4]
    seq.close()


def test_a_missing_seq_id_is_waited_for_then_skipped():
    seq = Sequencer("t", gap_s=0.3)
    assert run_all(seq, [1]) == [1]
    t = time.monotonic()
    assert run_all(seq, [3]) == [3]  # 2 never comes
    assert time.monotonic() - t >= 0.25
    with pytest.raises(ValueError, match="seq_id 2 was used already"):
        seq.submit(2, lambda: None)
    seq.close()


def test_a_future_long_polls_and_a_restart_is_named():
    f = Futures("b2")
    rid = f.new()
    t = time.monotonic()
    assert f.wait(rid, 0.2) is None and time.monotonic() - t >= 0.19  # still running: try again
    threading.Timer(0.1, f.finish, (rid, Result(json={"ok": 1}))).start()
    assert f.wait(rid, 5).json == {"ok": 1}
    with pytest.raises(KeyError, match="before the server restarted"):
        f.wait("b1-7", 0.1)
    with pytest.raises(KeyError, match="no request b2-99"):
        f.wait("b2-99", 0.1)


def test_the_registry_survives_a_restart(tmp_path):
    r = Registry(tmp_path / "tinker.json")
    r.add_session("s1", {"tags": []})
    r.add_model({"model_id": "s1:train:0", "base_model": "tiny-llama"})
    r.set_step("s1:train:0", 3)
    r.set_state("s1:train:0", {"path": "tinker://s1:train:0/weights/a", "dir": "x", "step": 2})
    again = Registry(tmp_path / "tinker.json")
    assert again.boot == r.boot + 1
    assert again.model("s1:train:0")["step"] == 3 and again.model("s1:train:0")["state"]["step"] == 2
    assert again.finish_session("s1", "success") == ["s1:train:0"]
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ValueError, match="bad.json: the Tinker server's registry does not read"):
        Registry(tmp_path / "bad.json")
