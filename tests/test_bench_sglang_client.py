"""``python -m bench.sglang_client``: SGLang's own serving client run against each launched server, its figures
reported as SGLang gives them."""

import contextlib
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import sglang_client  # noqa: E402


def fake_client(throughput_by_algo):
    """Stands in for ``python -m sglang.benchmark.serving``: appends one result line to its --output-file."""
    calls = []

    def client(command, **_):
        calls.append(command)
        option = dict(zip(command, command[1:]))
        algo = option["--base-url"].rsplit("/", 1)[1]
        concurrency = int(option["--max-concurrency"])
        line = {"output_throughput": throughput_by_algo[algo] * concurrency, "median_tpot_ms": 10.0 / concurrency,
                "median_ttft_ms": 50.0, "accept_length": None if algo == "ar" else 3.2,
                "completed": int(option["--num-prompts"]), "duration": 1.0}  # fmt: skip
        with open(option["--output-file"], "a") as raw:
            raw.write(json.dumps(line) + "\n")
        return type("Result", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    return client, calls


@contextlib.contextmanager
def fake_server(launch, log_path):
    yield "http://127.0.0.1:1/" + launch[launch.index("--algo") + 1]


def test_each_algorithm_is_served_and_measured_by_sglangs_client_at_every_concurrency(tmp_path):
    args = sglang_client.parse_args(["--model-path", "M", "--draft-model-path", "D", "--out", str(tmp_path),
                                     "--concurrency", "1,8", "--rounds", "2", "--", "--attention-backend", "triton"])
    client, calls = fake_client({"ar": 100.0, "ddtree": 130.0})
    report = sglang_client.run(args, serve=fake_server, client=client)
    assert [(row["algo"], row["concurrency"], row["completed"]) for row in report["rows"]] == [
        ("ar", 1, 2), ("ar", 8, 16), ("ddtree", 1, 2), ("ddtree", 8, 16)]
    option = dict(zip(calls[-1], calls[-1][1:]))
    assert calls[-1][1:3] == ["-c", sglang_client.serving_client_code()]
    assert (option["--dataset-name"], option["--random-input-len"], option["--random-output-len"],
            option["--random-range-ratio"], option["--temperature"]) == ("random-ids", "1024", "256", "1.0", "0")
    table = sglang_client.markdown(report)
    assert "| ddtree | 8 | 1040.0 | 1.30x |" in table and "| ar | 1 | 100.0 | – |" in table


def test_launch_arguments_carry_the_budget_the_drafter_and_the_server_flags():
    args = sglang_client.parse_args(["--model-path", "M", "--draft-model-path", "D", "--out", "o",
                                     "--concurrency", "4,16", "--", "--mem-fraction-static", "0.5"])
    assert sglang_client.launch_args("ddtree", args) == [
        "--algo", "ddtree", "--model-path", "M", "--draft-model-path", "D", "--budget", "auto",
        "--max-running-requests", "16", "--mem-fraction-static", "0.5"]  # fmt: skip
    assert sglang_client.launch_args("ar", args)[:4] == ["--algo", "ar", "--model-path", "M"]


def test_bad_input_gets_one_line_not_a_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sglang_client.parse_args(["--model-path", "M", "--out", "o", "--algos", "ar,eagle"])
    assert "--algos: unknown eagle" in capsys.readouterr().err
    args = sglang_client.parse_args(["--model-path", "M", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--algos ddtree needs --draft-model-path"):
        sglang_client.run(args, serve=fake_server, client=fake_client({"ar": 1.0})[0])

    def failing(command, **_):
        return type("Result", (), {"returncode": 1, "stdout": "", "stderr": "Traceback\nValueError: bad"})()

    with pytest.raises(SystemExit, match="SGLang's client failed for ar at concurrency 1: ValueError: bad"):
        sglang_client.run(sglang_client.parse_args(["--model-path", "M", "--out", str(tmp_path), "--algos", "ar"]),
                          serve=fake_server, client=failing)


def test_sglangs_client_runs_where_hugging_face_datasets_does_not_import(tmp_path):
    """SGLang's client imports ``datasets`` at start-up for a loader random-ids never uses; the GPU machine lacks it."""
    (tmp_path / "datasets.py").write_text("raise ImportError('not installed here')\n")
    (tmp_path / "stand_in_client.py").write_text(
        "import sys\nfrom datasets import load_dataset\n"
        "try:\n    load_dataset('mmmu')\nexcept ImportError as error:\n"
        "    open(sys.argv[-1], 'w').write(' '.join(sys.argv[1:-1]) + ' | ' + str(error))\n")
    out = tmp_path / "ran.txt"
    code = sglang_client.serving_client_code("stand_in_client")
    subprocess.run([sys.executable, "-c", code, "--backend", "sglang", str(out)], check=True, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(tmp_path)})  # fmt: skip
    arguments, error = out.read_text().split(" | ")
    assert arguments == "--backend sglang" and "only --dataset-name random-ids runs" in error
