"""Helpers shared by the tests that start real SGLang engines and servers in subprocesses."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager, suppress
from typing import Any, Iterator

from sglang_ddtree.serving import START_ATTEMPTS, port_clash


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ZYGOTE_SCRIPT = os.path.join(TESTS_DIR, "engine_zygote.py")

CONCURRENT_REQUESTS = 4

# Engine settings that make SGLang's CPU engine fit the CI machine (2 cores, no GPU).
CPU_ENGINE_ARGS = {
    "device": "cpu",
    "mem_fraction_static": 0.3,
    "max_total_tokens": 4096,
    "disable_cuda_graph": True,
    "log_level": "error",
    "sleep_on_idle": True,  # an idle scheduler otherwise spins a whole core, of CI's two
}


def run_engine_generate(
    engine_args: dict[str, Any],
    input_ids: list[list[int]],
    sampling_params: dict[str, Any] | list[dict[str, Any]],
    modes: tuple[str, ...] = ("sequential",),
    timeout: float = 900,
    env: dict[str, str] | None = None,
    streamed: list[bool] | None = None,
) -> dict[str, Any]:
    """Run ``sglang.Engine(**engine_args).generate(...)`` in a fresh process and return its JSON report.

    ``sampling_params``: one dict for every prompt, or one per prompt. ``modes``: "sequential" sends the prompts
    one at a time, "concurrent" sends the first
    ``CONCURRENT_REQUESTS`` as one batch; the report has
    ``{mode: {"output_ids": [...], "meta_info": [...]}}`` and the schedulers' ``internal_states``. ``streamed``
    (sequential mode): which prompts are sent with ``stream=True``; their chunks are under ``"chunks"``.

    A separate process per engine keeps SGLang's scheduler children, signal handlers and global state out of
    the test process, and lets a hung engine be killed as a process group; it is forked from a process that has
    imported SGLang already (``engine_zygote.py``), which saves an import of it per run.
    """
    request = {
        "engine_args": engine_args,
        "input_ids": input_ids,
        "sampling_params": sampling_params,
        "modes": list(modes),
        "concurrent_requests": CONCURRENT_REQUESTS,
        "streamed": streamed,
    }
    for attempt in range(1, START_ATTEMPTS + 1):
        returncode, stdout, stderr = _ZYGOTE.run(request, {**os.environ, **(env or {})}, timeout)
        if returncode == 0:
            return json.loads(stdout.strip().splitlines()[-1])
        if attempt == START_ATTEMPTS or not port_clash(stderr):  # engines of parallel tests race for free ports
            raise AssertionError(f"engine run failed (exit {returncode}):\n{stderr[-6000:]}")


class _EngineZygote:
    """This test process's ``engine_zygote.py``, started at its first engine run: each run is a child forked from
    it (its own session, environment and output files), which skips importing SGLang again."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.log_path = ""

    def _reply(self, deadline: float) -> dict[str, Any] | None:
        """The zygote's next line, or None at the deadline or if it died."""
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.proc.stdout], [], [], min(left, 5.0))[0]:
                line = self.proc.stdout.readline()
                return json.loads(line) if line else None
            if self.proc.poll() is not None:
                return None
        return None

    def run(self, request: dict[str, Any], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
        """``(returncode, stdout, stderr)`` of one engine run; on timeout its process group is killed and the run
        fails with its stderr's tail. A run cut short for any reason takes the zygote down with it (its protocol
        would be out of step): the next run starts a new one."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            with tempfile.NamedTemporaryFile(prefix="engine_zygote_", suffix=".log", delete=False) as log:
                self.log_path = log.name
                self.proc = subprocess.Popen([sys.executable, ZYGOTE_SCRIPT], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="engine_run_") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            job = {"request": request, "env": env, "cwd": os.getcwd(), "stdout": out, "stderr": err}
            started = None
            try:
                self.proc.stdin.write(json.dumps(job) + "\n")
                self.proc.stdin.flush()
                deadline = time.monotonic() + timeout
                started = self._reply(deadline)
                if started is None:
                    raise AssertionError(f"the engine zygote did not fork a run:\n{_read(self.log_path)[-4000:]}")
                ended = self._reply(deadline)
                if ended is None:
                    raise AssertionError(f"engine run timed out after {timeout}s:\n{_read(err)[-4000:]}")
            except BaseException:
                if started is not None:
                    with suppress(ProcessLookupError):  # the run may have ended meanwhile
                        os.killpg(started["pid"], signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
                raise
            return ended["returncode"], _read(out), _read(err)

    def close(self) -> None:
        """End the zygote (it exits when its input closes) and remove its log: at exit, and before a new one."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.stdin.close()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if self.log_path:
            with suppress(FileNotFoundError):
                os.remove(self.log_path)
            self.log_path = ""


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


_ZYGOTE = _EngineZygote()
atexit.register(_ZYGOTE.close)


def accepted_drafts_of_tree_verifies(report: dict, modes: tuple[str, ...], new_tokens: int, block_size: int) -> int:
    """Check each request's speculative metrics in an engine report and return the drafted tokens accepted.

    Every request generated ``new_tokens``; its accept histogram has one entry per verify, indexed by accepted
    nodes, so at most one per draft depth of a ``block_size`` block.
    """
    accepted = 0
    for mode in modes:
        for meta in report[mode]["meta_info"]:
            assert meta["completion_tokens"] == new_tokens
            histogram = meta["spec_accept_histogram"]
            assert sum(histogram) == meta["spec_verify_ct"] > 0 and len(histogram) <= block_size
            accepted += meta["spec_num_correct_drafts"]
    return accepted


def accept_histogram(report: dict, modes: tuple[str, ...]) -> list[int]:
    """Verifies by drafts accepted, over every request of ``modes`` in an engine report."""
    histogram: list[int] = []
    for mode in modes:
        for meta in report[mode]["meta_info"]:
            per_request = meta["spec_accept_histogram"]
            histogram += [0] * (len(per_request) - len(histogram))
            for accepted, count in enumerate(per_request):
                histogram[accepted] += count
    return histogram


def assert_paths_past_the_first_draft(report: dict, modes: tuple[str, ...], at_least: int) -> None:
    """At least ``at_least`` verifies over ``modes`` accepted two drafts or more: paths through depth 2 of the tree,
    where a verify's mask rows, positions and state links first differ from a chain of one draft."""
    histogram = accept_histogram(report, modes)
    deep = sum(histogram[2:])
    assert deep >= at_least, f"{deep} verifies past the first draft, {at_least} wanted (accept histogram {histogram})"


def http_json(url: str, payload: dict[str, Any] | None = None, timeout: float = 300) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    return json.loads(body) if body else None  # some endpoints (/abort_request) answer 200 with no body


def record(entry: dict[str, Any]) -> None:
    """Append one result line to ``$GPU_SUITE_REPORT`` (JSON lines for tests/gpu/RESULTS.md), if it is set."""
    path = os.environ.get("GPU_SUITE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def with_fake_gpu(tmp_path, mib: int) -> dict[str, str]:
    """An environment whose ``nvidia-smi`` reports one GPU of ``mib`` MiB (the launcher's only GPU query)."""
    fake = tmp_path / "fake_gpu" / "nvidia-smi"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!/bin/sh\necho {mib}\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}


@contextmanager
def env_vars(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
