"""GPU suite: each failure's reason goes to the suite's report the moment its test fails.

The device machine's calls end at a deadline, and pytest prints failures only in its closing summary: a run cut
short lost the reasons of the tests that had failed before the cut (tests/gpu/RESULTS.md run 58)."""

from __future__ import annotations

import pytest

from support import record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        record({"test": "failure", "nodeid": report.nodeid, "when": report.when, "reason": report.longreprtext[-3000:]})
