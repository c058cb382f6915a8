"""Reliability: code that escapes the restricted builtins still cannot fork, spawn, or touch the network.

The escape route walks object.__subclasses__() to a class defined in Python,
takes the *real* builtins from its __init__'s globals and imports `os` with the
real __import__ -- restricted builtins cannot stop that; the audit hook must
refuse what the code then tries.
"""

import pytest

from trajtune.envs.sandbox import Sandbox


def _with_os(body: str) -> str:
    return (
        "def f():\n"
        "    osmod = None\n"
        "    for c in ().__class__.__base__.__subclasses__():\n"
        "        try:\n"
        "            g = c.__init__.__globals__\n"
        "        except Exception:\n"
        "            continue\n"
        "        if '__builtins__' in g:\n"
        "            b = g['__builtins__']\n"
        "            try:\n"
        "                imp = b['__import__']\n"
        "            except TypeError:\n"
        "                imp = b.__import__\n"
        "            osmod = imp('os').__dict__\n"
        "            break\n"
        "    if osmod is None:\n"
        "        return 'no escape'\n"
        f"    {body}\n"
        "    return 1\n"
    )


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox()
    yield box
    box.close()


@pytest.mark.parametrize("body,event", [
    ("osmod['system']('echo pwned > /tmp/trajtune_pwned')", "os.system"),
    ("[osmod['fork']() for _ in range(100)]", "os.fork"),
    ("osmod['remove']('/tmp/trajtune_does_not_exist')", "os.remove"),
    ("osmod['kill'](1, 9)", "os.kill"),
])
def test_escaped_os_calls_are_refused(sandbox, body, event):
    outcome = sandbox.run(_with_os(body), "f", [((), 1)])
    assert outcome[0].startswith("forbidden") and event in outcome[0], outcome


def test_socket_and_subprocess_imports_are_refused_everywhere(sandbox):
    for mod in ("socket", "subprocess", "os", "sys", "ctypes", "shutil"):
        src = f"def f():\n    import {mod}\n    return 1\n"
        assert sandbox.run(src, "f", [((), 1)]) == (f"forbidden: import {mod}",), mod
    via_builtins = "def f():\n    return __import__('socket').socket()\n"
    assert sandbox.run(via_builtins, "f", [((), 1)])[0].startswith(("forbidden", "error: NameError"))


def test_worker_survives_and_keeps_serving_after_refusals(sandbox):
    sandbox.run(_with_os("[osmod['fork']() for _ in range(100)]"), "f", [((), 1)])
    assert sandbox.run("def f(a):\n    return a * 2\n", "f", [((21,), 42)]) == ("pass",)
