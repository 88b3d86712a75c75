"""Helpers shared by the tests that start real SGLang engines and servers in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from typing import Any, Iterator

from sglang_ddtree.serving import START_ATTEMPTS, port_clash


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ENGINE_SCRIPT = os.path.join(TESTS_DIR, "engine_generate.py")

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
    the test process, and lets a hung engine be killed as a process group.
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
        proc = subprocess.Popen(
            [sys.executable, ENGINE_SCRIPT, json.dumps(request)],
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise AssertionError(f"engine run timed out after {timeout}s:\n{stderr[-4000:]}")
        if proc.returncode == 0:
            return json.loads(stdout.strip().splitlines()[-1])
        if attempt == START_ATTEMPTS or not port_clash(stderr):  # engines of parallel tests race for free ports
            raise AssertionError(f"engine run failed (exit {proc.returncode}):\n{stderr[-6000:]}")


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
