"""Which code a benchmark report describes.

The GPU machine receives a copy of the working tree whose ``.git`` may name an older commit than the one being
measured; the caller then names the commit in ``SGLANG_DDTREE_BENCH_COMMIT`` (a literal in the command it sends),
and reports carry that instead of what ``git`` says there.
"""

from __future__ import annotations

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
