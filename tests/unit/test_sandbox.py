"""The sandbox: real execution, time and resource limits, forbidden operations, memoization, restarts."""

import time

import pytest

from trajtune.envs.sandbox import Sandbox

ADD = "def f(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(case_timeout=0.2, slack=1.0)
    yield box
    box.close()


def test_runs_cases_and_reports_outcomes(sandbox):
    assert sandbox.run(ADD, "f", [((1, 2), 3), ((2, 2), 5), (([1], [2]), [1, 2])]) == ("pass", "fail", "pass")
    assert sandbox.run("def f(a, b):\n    return a // b\n", "f", [((4, 2), 2), ((1, 0), 0)]) == (
        "pass", "error: ZeroDivisionError")
    assert sandbox.run("def f(:\n", "f", [((1,), 1)]) == ("error: SyntaxError",)
    assert sandbox.run(ADD, "g", [((1, 2), 3)]) == ("error: KeyError",)  # no such function


def test_infinite_loop_is_a_failed_test_not_a_hang(sandbox):
    loop = "def f(x):\n    while True:\n        x += 1\n"
    start = time.perf_counter()
    assert sandbox.run(loop, "f", [((1,), 1), ((2,), 2)]) == ("timeout", "timeout")
    assert time.perf_counter() - start < 2.0
    assert sandbox.run(ADD, "f", [((1, 2), 3)]) == ("pass",)  # the worker survived


def test_code_that_swallows_the_alarm_gets_the_worker_killed_and_restarted():
    box = Sandbox(case_timeout=0.1, slack=0.3)
    stubborn = ("def f(x):\n    try:\n        while True:\n            x += 1\n"
                "    except:\n        while True:\n            x += 1\n")
    try:
        assert box.run(stubborn, "f", [((1,), 1)]) == ("timeout",)
        assert box.n_restarts == 1
        assert box.run(ADD, "f", [((1, 2), 3)]) == ("pass",)  # a fresh worker took over
    finally:
        box.close()


def test_forbidden_imports_and_builtins(sandbox):
    assert sandbox.run("import os\ndef f():\n    return 1\n", "f", [((), 1)]) == ("forbidden: import os",)
    inside = "def f():\n    import socket\n    return socket.socket()\n"
    assert sandbox.run(inside, "f", [((), 1)]) == ("forbidden: import socket",)
    assert sandbox.run("def f():\n    import math\n    return math.floor(2.5)\n", "f", [((), 2)]) == ("pass",)
    opener = "def f(path):\n    open(path, 'w').write('x')\n    return 1\n"
    assert sandbox.run(opener, "f", [(("/tmp/x",), 1)]) == ("error: NameError",)  # no open() at all


def _escape_to_fileio(path):
    """Reach the real FileIO class through object.__subclasses__ (restricted builtins do not stop this)."""
    return (
        "def f(path):\n"
        "    todo, seen = list(().__class__.__base__.__subclasses__()), []\n"
        "    while todo:\n"
        "        c = todo.pop()\n"
        "        if c.__name__ == 'FileIO':\n"
        "            c(path, 'w').write(b'x')\n"
        "            return 1\n"
        "        try:\n"
        "            todo += c.__subclasses__()\n"
        "        except TypeError:\n"
        "            pass\n"
        "    return 0\n"
    )


def test_audit_hook_blocks_writes_even_after_a_builtins_escape(sandbox, tmp_path):
    target = tmp_path / "written.txt"
    outcome = sandbox.run(_escape_to_fileio(str(target)), "f", [((str(target),), 1)])
    assert outcome[0].startswith("forbidden: open for writing"), outcome
    assert not target.exists()


def test_memory_bomb_is_a_failed_test(sandbox):
    bomb = "def f():\n    x = [0] * (10 ** 9)\n    return 1\n"
    assert sandbox.run(bomb, "f", [((), 1)]) == ("error: MemoryError",)
    assert sandbox.run(ADD, "f", [((1, 2), 3)]) == ("pass",)


def test_results_are_memoized_by_exact_source():
    box = Sandbox()
    try:
        cases = [((1, 2), 3)]
        for _ in range(5):
            box.run(ADD, "f", cases)
        assert box.n_jobs == 1
        box.run(ADD + "\n", "f", cases)  # a different text is a different program
        box.run(ADD, "f", [((1, 2), 4)])  # different cases too
        assert box.n_jobs == 3
    finally:
        box.close()


def test_throughput_of_distinct_sources():
    box = Sandbox()
    try:
        box.run(ADD, "f", [((1, 2), 3)])  # start the worker
        start = time.perf_counter()
        for i in range(100):
            assert box.run(f"def f(a, b):\n    return a + b + {i}\n", "f", [((1, 2), 3 + i)]) == ("pass",)
        per_job = (time.perf_counter() - start) / 100
        assert per_job < 0.01, f"{per_job * 1e3:.1f} ms per sandbox job: the worker should be persistent"
    finally:
        box.close()


def test_a_caller_time_limit_mid_job_retires_the_worker_so_no_stale_reply_is_read():
    """A StepTimeout (faults.time_limit) that interrupts a job leaves its reply in the pipe;
    the worker is killed, and the next job gets its own answer."""
    from trajtune.sources.faults import StepTimeout, time_limit

    box = Sandbox(case_timeout=2.0, slack=1.0)
    try:
        slow = "def f(x):\n    while True:\n        x += 1\n"
        with pytest.raises(StepTimeout), time_limit(0.3):
            box.run(slow, "f", [((1,), 1)])
        assert box.n_restarts == 1
        assert box.run(ADD, "f", [((1, 2), 3), ((1, 1), 3)]) == ("pass", "fail")
    finally:
        box.close()
