"""What the load-and-faults tests (CPU engine and GPU suite) read from a running server: its request and KV pools
(``/v1/loads``), their peaks while a phase runs, the wait for idle, and streaming requests read chunk by chunk."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from typing import Any, Iterator

from support import http_json

IDLE_TIMEOUT_S = 60
LEAK_MESSAGES = ("memory leak detected", "Mem Leak Detected", "double free", "use-after-free")
POOLS = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens")


def loads(url: str) -> dict[str, Any]:
    (load,) = http_json(url + "/v1/loads")["loads"]
    return load


def pools(load: dict[str, Any]) -> dict[str, int]:
    return {k: load[k] for k in POOLS}


def wait_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> tuple[dict[str, Any], float]:
    """The first ``/v1/loads`` snapshot with no request running or waiting and no KV token in use, and the
    seconds it took to come; fails after ``timeout_s``."""
    start = time.monotonic()
    while True:
        load = loads(url)
        if not any(pools(load).values()):
            return load, round(time.monotonic() - start, 2)
        assert time.monotonic() - start < timeout_s, f"not idle after {timeout_s}s: {pools(load)}"
        time.sleep(0.2)


class Stream:
    """A streaming ``/generate`` over its own connection, read chunk by chunk."""

    def __init__(self, url: str, prompt: list[int], sampling_params: dict[str, Any], rid: str):
        parsed = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
        body = {"input_ids": prompt, "sampling_params": sampling_params, "stream": True, "rid": rid}
        self.conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200

    def chunks(self) -> Iterator[dict[str, Any]]:
        for line in self.response:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield json.loads(line[len(b"data: ") :])

    def close(self) -> None:
        self.response.close()
        self.conn.close()


class LoadSampler:
    """Polls ``/v1/loads`` in a thread while a phase runs: the peak of each pool figure."""

    def __init__(self, url: str):
        self.url, self.peak, self.stop = url, dict.fromkeys(POOLS, 0), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            for k, v in pools(loads(self.url)).items():
                self.peak[k] = max(self.peak[k], v)

    def __enter__(self) -> LoadSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
