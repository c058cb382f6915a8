"""`sources.vllm.Servers` without a server: how a call's requests are dealt out (no vLLM needed)."""

import threading
import time

from trajtune.sources.vllm import Servers, first_error


class FakeServers(Servers):
    """Servers whose HTTP calls are answered here; records how many prompt-log-prob calls each URL has at once."""

    def __init__(self, urls):
        self.lock, self.busy, self.most = threading.Lock(), {}, {}
        super().__init__(urls)

    def _call(self, url, method, path, body, timeout=None):
        if path == "/health":
            return None
        with self.lock:
            self.busy[url] = self.busy.get(url, 0) + 1
            self.most[url] = max(self.most.get(url, 0), self.busy[url])
        time.sleep(0.02)  # long enough for a second concurrent call to overlap
        with self.lock:
            self.busy[url] -= 1
        row = body["prompt"]
        return {"choices": [{"prompt_logprobs": [None] + [{str(t): {"logprob": -float(t)}} for t in row[1:]]}]}


def test_prompt_log_probs_go_one_at_a_time_to_a_server_listed_twice_and_come_back_in_order():
    # vLLM 0.32's CPU build with LoRA enabled crashes on two prompt-log-prob requests batched together: a server
    # listed twice (two shares) must still get them one after the other
    servers = FakeServers(["http://a:1", "http://a:1", "http://b:2"])
    rows = [[9, i, i + 1] for i in range(1, 7)]
    got = servers.prompt_logprobs(rows)
    assert got == [[-float(i), -float(i + 1)] for i in range(1, 7)]
    assert servers.most == {"http://a:1": 1, "http://b:2": 1}


def test_the_first_error_of_a_vllm_log_is_the_cause_not_the_engines_summary(tmp_path):
    """The lines vLLM's CPU build wrote when its workers met a head size it has no kernel for (shortened)."""
    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer pid=8314) WARNING 12-07 04:11:35 [system_utils.py:255] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
        "`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n\n"
        "(EngineCore pid=7612) INFO 12-07 04:08:57 [core.py:133] Initializing a V1 LLM engine (v0.32.0)\n"
        "/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is "
        "deprecated\n"
        "(Worker pid=7712) ERROR 12-07 04:10:19 [multiproc_executor.py:1063] Traceback (most recent call last):\n"
        "(Worker pid=7712) ERROR 12-07 04:10:19 [multiproc_executor.py:1063]   File \"cpu_attn.py\", line 9, in fwd\n"
        "(Worker pid=7712) ERROR 12-07 04:10:19 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention "
        "configuration: head_dim=16 isa=2 kv_cache_idx=0\n"
        "(EngineCore pid=7612) ERROR 12-07 04:10:19 [core.py:1512] RuntimeError: Worker failed with error 'Unsupported "
        "CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0', please check the stack trace above\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above)\n")
    assert first_error(log) == "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    log.write_text("(EngineCore pid=1) INFO [core.py:1] nothing went wrong\n")
    assert first_error(log) is None
    assert first_error(tmp_path / "absent.log") is None
