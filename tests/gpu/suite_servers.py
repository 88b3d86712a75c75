"""Which servers a GPU suite module starts, and how: those its selected tests talk to, so that a ``-k`` run of a
few tests (a short call on the GPU machine) starts only their servers, optionally without prefill graphs.

A test names the kinds of server it talks to with ``@pytest.mark.servers(...)``; its ``kind`` parameter is one
more, and its ``backend`` parameter says on which attention backend.
"""

from __future__ import annotations

import os

import pytest


def prefill_graph_flags() -> list[str]:
    """``GPU_SUITE_PREFILL_GRAPHS=0``: servers start without SGLang's breakable prefill graphs (58 token counts by
    default, 2-3 minutes of each start on the H200, most of a short call: RESULTS.md runs 34 and 46). The decode
    and verify graphs the suites test are captured either way; by default the servers keep SGLang's default."""
    return ["--cuda-graph-backend-prefill", "disabled"] if os.environ.get("GPU_SUITE_PREFILL_GRAPHS") == "0" else []


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
