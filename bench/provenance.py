"""Which code a benchmark report describes, and where a report is written.

The GPU machine receives a copy of the working tree whose ``.git`` may name an older commit than the one being
measured; the caller then names the commit in ``SGLANG_DDTREE_BENCH_COMMIT`` (a literal in the command it sends),
and reports carry that instead of what ``git`` says there.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

COMMIT_ENV = "SGLANG_DDTREE_BENCH_COMMIT"


def checkout_commit() -> str:
    """``SGLANG_DDTREE_BENCH_COMMIT`` when set, else the checkout's short commit with ``+dirty`` for uncommitted
    changes to tracked files, or ``?`` outside a git checkout."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "?"
    return commit + ("+dirty" if dirty else "")


def write_report(out: str, name: str, report: dict, markdown: str) -> None:
    """``NAME.json`` and ``NAME.md`` in the folder ``out`` (made if missing); the Markdown is also printed."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(report, indent=1))
    (folder / f"{name}.md").write_text(markdown)
    print(markdown)


def refuse_another_cards_report(report_path: Path, gpu: str, prog: str) -> None:
    """Exit with one line when a report to be resumed (``--resume``) was measured on another GPU: one table's
    timings come from one card (a GPU call may get an H100 where the last got an H200)."""
    if not report_path.is_file():
        return
    theirs = json.loads(report_path.read_text()).get("meta", {}).get("gpu")
    if theirs and theirs != gpu:
        raise SystemExit(f"python -m {prog}: error: --resume: {report_path} was measured on {theirs}, this is {gpu}; "
                         "start a new folder")
