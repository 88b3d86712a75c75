"""Which servers a GPU suite module starts, and how: those its selected tests talk to, so that a ``-k`` run of a
few tests (a short call on the GPU machine) starts only their servers, optionally without prefill graphs.

A test names the kinds of server it talks to with ``@pytest.mark.servers(...)``; its ``kind`` parameter is one
more, and its ``backend`` parameter says on which attention backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Callable, Iterator

import pytest

from sglang_ddtree.serving import ServerStartError, free_port, launched_server
from support import record

# A step-time table under which --budget auto verifies bonus-only, narrow and the widest trees: narrow trees pay
# alone and at a few requests, the widest is dear; from nine requests on, bonus-only verifies win.
AUTO_STEP_MS = {1: [1.0, 1.02, 1.05, 1.1, 3.0], 4: [1.0, 1.05, 1.1, 1.2, 3.0], 16: [1.0, 100.0, 100.0, 100.0, 100.0]}


def prefill_graph_flags() -> list[str]:
    """``GPU_SUITE_PREFILL_GRAPHS=0``: servers start without SGLang's breakable prefill graphs (58 token counts by
    default, 2-3 minutes of each start on the H200, most of a short call: RESULTS.md runs 34 and 46). The decode
    and verify graphs the suites test are captured either way; by default the servers keep SGLang's default."""
    return ["--cuda-graph-backend-prefill", "disabled"] if os.environ.get("GPU_SUITE_PREFILL_GRAPHS") == "0" else []


H200_MIB = 143_771  # the card the suites' memory shares were set on (RESULTS.md's machine)


def mem_fraction_flags(h200_fraction: float) -> list[str]:
    """``--mem-fraction-static`` that gives a server on this card what ``h200_fraction`` gave it on the H200. SGLang
    sizes a server from ``total memory x fraction`` less what is in use when it starts, its neighbours' included, so
    what a suite's server needs beside its neighbours is an amount: the H200's shares left an 80 GB H100's servers
    no KV cache (RESULTS run 72). Called at launch (CPU CI imports the suites without a GPU); the total comes from
    ``nvidia-smi``, so the test process holds no CUDA context."""
    total_mib = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, check=True).stdout.split()[0]  # fmt: skip
    return ["--mem-fraction-static", f"{min(0.9, h200_fraction * H200_MIB / float(total_mib)):.4f}"]


def servers_used_by(item: pytest.Item) -> set[tuple[str, str]]:
    """The (kind, backend) servers one test talks to: its ``servers`` marker's kinds plus its ``kind`` parameter,
    on its ``backend`` parameter; none for a test without the marker or skipped for want of a backend (an empty
    parameter set)."""
    marker = item.get_closest_marker("servers")
    if marker is None or item.get_closest_marker("skip"):
        return set()
    params = item.callspec.params
    kinds = set(marker.args) | ({params["kind"]} if "kind" in params else set())
    return {(kind, params["backend"]) for kind in kinds}


def servers_of_selected_tests(request: pytest.FixtureRequest) -> list[tuple[str, str]]:
    """The (kind, backend) servers that the selected tests of the requesting module talk to, in a stable order."""
    module_items = [item for item in request.session.items if item.module is request.module]
    return sorted(set().union(*map(servers_used_by, module_items)))


def started_servers(
    request: pytest.FixtureRequest,
    launch: Callable[[str, str], tuple[list[str], dict[str, str]]],
    label: str,
    ready_timeout: float,
) -> Iterator[dict[tuple[str, str], str]]:
    """For a module fixture: ``{(kind, backend): url, or why it did not start}`` for the servers its selected tests
    talk to, started side by side and stopped when the module ends; ``launch(kind, backend)`` gives each one's
    launcher arguments and environment. Each start's seconds go to the report as ``{label}_server_start``."""

    def start(stack: ExitStack, kind: str, backend: str) -> tuple[tuple[str, str], str]:
        args, env = launch(kind, backend)
        t0 = time.perf_counter()
        try:
            url = stack.enter_context(launched_server(args, free_port(), env=env, ready_timeout=ready_timeout))
        except ServerStartError as e:
            return (kind, backend), str(e)
        record({"test": f"{label}_server_start", "kind": kind, "backend": backend, "s": round(time.perf_counter() - t0, 1)})
        return (kind, backend), url

    combos = servers_of_selected_tests(request)
    with ExitStack() as stack, ThreadPoolExecutor(len(combos)) as pool:
        yield dict(pool.map(lambda combo: start(stack, *combo), combos))


def url_of(servers: dict[tuple[str, str], str], kind: str, backend: str) -> str:
    url = servers.get((kind, backend), f"no {kind} server on {backend}")
    assert url.startswith("http://"), url
    return url


def auto_budget_args(tmp_dir: str, widths: list[int]) -> list[str]:
    """``--budget auto`` with :data:`AUTO_STEP_MS` over ``widths`` (five, the widest the server's tree)."""
    table = os.path.join(tmp_dir, "step_times.json")
    with open(table, "w") as f:
        json.dump({"widths": widths, "batch_sizes": list(AUTO_STEP_MS), "step_ms": list(AUTO_STEP_MS.values())}, f)
    return ["--budget", "auto", "--step-time-table", table]
