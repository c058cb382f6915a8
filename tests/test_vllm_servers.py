"""`sources.vllm.Servers` without a server: how a call's requests are dealt out (no vLLM needed)."""

import threading
import time

from trajtune.sources.vllm import Servers


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
