"""``bench.step_trace`` and ``bench.step_profile``: a traced step's wall time is accounted to the scheduler's
functions, the worker's phases, host syncs, launches and GPU busy/idle time; the bench reports it per cell."""

import gzip
import importlib
import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import side_by_side, step_profile, step_trace  # noqa: E402

SCHEDULER = "sglang/srt/managers/scheduler.py({line}): {name}"
WORKER = "sglang_ddtree/speculative/ddtree_worker.py({line}): {name}"


def python(name: str, ts: float, dur: float, template: str = SCHEDULER, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "python_function", "name": template.format(line=10, name=name), "ts": ts, "dur": dur,
            "pid": 7, "tid": tid}  # fmt: skip


def runtime(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def gpu(ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": "k", "ts": ts, "dur": dur, "pid": 0, "tid": 99}


def iteration(t: float) -> list[dict]:
    """One scheduler iteration of 1000 us starting at ``t``: schedule 100, run_batch 400 (draft 150 with two kernel
    launches, verify 200 with one graph launch), process_batch_result 300 of which 250 wait on an event, 200 us
    of loop; on the GPU a 300 us kernel and a 100 us copy that overlaps it by 50 us."""
    return [
        python("get_next_batch_to_run", t, 100),
        python("run_batch", t + 100, 400),
        python("forward_batch_generation", t + 110, 380, WORKER),
        python("_draft_block", t + 120, 150, WORKER),
        runtime("cudaLaunchKernel", t + 130, 10), runtime("cudaLaunchKernel", t + 150, 10),
        python("run_eagle_verify", t + 280, 200, WORKER),
        runtime("cudaGraphLaunch", t + 300, 20),
        python("process_batch_result", t + 500, 300),
        runtime("cudaEventSynchronize", t + 520, 250),
        gpu(t + 140, 300), gpu(t + 390, 100, "gpu_memcpy"),
    ]  # fmt: skip


def trace(iterations: int) -> list[dict]:
    events = [e for i in range(iterations) for e in iteration(1000.0 * i)]
    events.append(python("run_batch", 1000.0 * iterations + 100, 400))  # the next iteration's start closes the last
    events.insert(0, python("run_batch", 50.0, 10, tid=2))  # another thread's functions are not the scheduler's
    return events


def test_each_iteration_between_run_batch_starts_is_accounted_to_the_millisecond():
    steps = step_trace.account_steps(trace(3))
    assert len(steps) == 3
    step = steps[1]
    assert step.wall == pytest.approx(1.0)
    assert step.scheduler == pytest.approx({"recv_requests": 0.0, "process_input_requests": 0.0,
                                            "get_next_batch_to_run": 0.1, "run_batch": 0.4,
                                            "process_batch_result": 0.3, "launch_batch_sample_if_needed": 0.0,
                                            "loop": 0.2})  # fmt: skip
    assert sum(step.scheduler.values()) == pytest.approx(step.wall)
    assert step.worker == pytest.approx({"_draft_block": 0.15, "run_eagle_verify": 0.2})
    assert (step.launches, step.graph_launches) == (3, 1)
    assert step.launch == pytest.approx(0.04)
    assert step.sync == pytest.approx(0.25)
    assert step.gpu_busy == pytest.approx(0.35)  # 300 + 100 - 50 of overlap
    assert step.gpu_idle == pytest.approx(0.65)
    assert step.gpu_by_category == pytest.approx({"kernel": 0.3, "gpu_memcpy": 0.1})


def test_a_recursive_function_counts_once_and_a_trace_without_two_run_batches_has_no_step():
    events = trace(2) + [python("process_batch_result", 520, 100)]  # re-entered inside the outer call
    assert step_trace.account_steps(events)[0].scheduler["process_batch_result"] == pytest.approx(0.3)
    assert step_trace.account_steps([python("run_batch", 0, 10)]) == []


def annotation(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def test_profiler_ranges_account_a_step_as_python_stacks_do():
    """A trace without Python stacks: SGLang's ``scheduler.*`` ranges and the worker's ``ddtree.*`` ranges stand in
    for the functions; other ranges are not functions of the step."""
    renamed = {"get_next_batch_to_run": "scheduler.get_next_batch_to_run", "run_batch": "scheduler.run_batch",
               "process_batch_result": "scheduler.process_batch_result", "_draft_block": "ddtree._draft_block",
               "run_eagle_verify": "ddtree.run_eagle_verify"}  # fmt: skip

    def without_stacks(event: dict) -> dict:
        function = step_trace.python_function(event["name"])
        if event["cat"] != "python_function":
            return event
        return annotation(renamed.get(function, "forward_batch_generation"), event["ts"], event["dur"], event["tid"])

    stacked = step_trace.account_steps(trace(3))
    ranged = step_trace.account_steps([*map(without_stacks, trace(3)), annotation("prefill_graph", 120, 900)])
    assert ranged == stacked


def test_the_bench_row_is_the_median_step_and_reads_back_from_a_gzipped_trace(tmp_path):
    events = trace(3)
    events += [gpu(1000 + 600, 300)]  # iteration 1 gets 300 us more GPU work: the median stays at 0.35
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    row = step_trace.median_step(step_trace.account_steps(step_trace.load_trace(str(path))))
    assert row["steps"] == 3 and row["wall_ms"] == 1.0 and row["gpu_busy_ms"] == 0.35 and row["sync_ms"] == 0.25
    assert row["worker_ms"] == {"_draft_block": 0.15, "run_eagle_verify": 0.2}


def test_markdown_shows_untraced_and_traced_columns_and_the_worker_split():
    accounted = step_trace.median_step(step_trace.account_steps(trace(3)))
    report = {"meta": {"date": "d", "commit": "c", "gpu": "g", "model_path": "m", "max_new_tokens": 8},
              "cells": [{"config": "ddtree B=32", "batch": 1, "tau": 2.1, "step_wall_ms": 4.5,
                         "gpu_phase_ms": {"draft": 1.0, "verify": 3.0}, "traced": accounted},
                        {"config": "ar", "batch": 8, "tau": None, "step_wall_ms": 1.5, "gpu_phase_ms": None,
                         "traced": {"error": "no trace written under x"}}]}  # fmt: skip
    text = step_profile.markdown(report)
    assert ("| ddtree B=32 | 1 | benchmark | 2.1 | 4.50 | 4.00 | 1.00 | 0.35 | 0.65 | 0.25 | 3 (1) | 0.40 | 0.30 "
            "| 0.10 | 0.20 |") in text
    assert "| ar | 8 | benchmark | – | 1.50 | – | no trace written under x |" in text
    assert "| config | bs | _draft_block | run_eagle_verify |\n|:--|--:|--:|--:|\n| ddtree B=32 | 1 | 0.15 | 0.20 |" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algos", "ar,eagle"], "unknown algorithm(s) eagle"),
        (["--algos", "ddtree"], "dflash and ddtree need --draft-model-path"),
        (["--algos", "ar", "--batch-sizes", "0"], "--batch-sizes take positive integers"),
        (["--algos", "ar", "--trace-steps", "1"], "--trace-steps 0 (no trace) or at least 2"),
        (["--algos", "ar", "--simulate-tau", "ar=2"], "--simulate-tau names speculative algorithms of --algos"),
        (["--algos", "ar", "--simulate-tau", "ddtree"], "'ddtree' is not ALGO=MEAN"),
        (["--algos", "ar", "--simulate-tau", "ddtree=0.5"], "a mean acceptance length is at least 1"),
        (["--algos", "ar", "--ab-env", "SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN"], "--ab-env takes NAME=VALUE"),
        (["--algos", "ar", "--ab-env", "=0"], "--ab-env takes NAME=VALUE"),
        (["--algos", "ar", "--widths", "1,4"], "--widths must ascend from 1 (the last is the drafted tree), with ddtree"),
        (["--algos", "ddtree", "--draft-model-path", "d", "--widths", "2,4"], "--widths must ascend from 1"),
        (["--algos", "ar", "--write-step-table", "t.json"], "--write-step-table needs --widths"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        step_profile.parse_args(["--model-path", "m", "--out", "o", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_each_server_gets_the_phase_timer_trace_ranges_and_simulated_acceptance_it_was_asked_for():
    args = step_profile.parse_args(["--model-path", "m", "--draft-model-path", "d", "--out", "o",
                                    "--simulate-tau", "dflash=1.42,ddtree=1.9"])[0]  # fmt: skip
    assert step_profile.server_env("ar", args) == {"SGLANG_DDTREE_TRACE_RANGES": "1"}
    assert step_profile.server_env("dflash", args) == {"SGLANG_DDTREE_TRACE_RANGES": "1",
                                                       "SGLANG_SIMULATE_ACC_LEN": "1.42"}  # fmt: skip
    assert step_profile.server_env("ddtree B=32", args) == {
        "SGLANG_DDTREE_PROFILE_STEPS": "1", "SGLANG_DDTREE_TRACE_RANGES": "1", "SGLANG_SIMULATE_ACC_LEN": "1.9"}
    syncs = step_profile.parse_args(["--model-path", "m", "--out", "o", "--algos", "ar", "--sync-debug"])[0]
    assert step_profile.server_env("ar", syncs) == {"SGLANG_DDTREE_TRACE_RANGES": "1", "SGLANG_DDTREE_SYNC_DEBUG": "1"}
    profiled = step_profile.parse_args(["--model-path", "m", "--out", "o", "--algos", "ar", "--host-profile"])[0]
    assert step_profile.server_env("ar", profiled) == {"SGLANG_DDTREE_TRACE_RANGES": "1",
                                                       "SGLANG_DDTREE_HOST_PROFILE": "1"}  # fmt: skip


def test_the_host_profile_is_read_per_iteration_between_two_reports_and_tabled_by_own_time():
    """Two ``ddtree_host_profile`` reports of a server: only what grew between them counts, divided by the decode
    iterations between them; functions that did not run in between are left out."""
    from sglang_ddtree.profiling.ddtree_host_profile import per_iteration

    before = {"iterations": 10, "functions": {"a.py:1(plan)": [10, 5.0], "b.py:2(idle)": [3, 1.0]}}
    after = {"iterations": 30, "functions": {"a.py:1(plan)": [50, 25.0], "b.py:2(idle)": [3, 1.0],
                                             "c.py:3(sample)": [20, 30.0]}}  # fmt: skip
    profile = per_iteration(before, after)
    assert profile == {"iterations": 20, "own_ms": 2.5,
                       "by_own_ms": [["c.py:3(sample)", 1.0, 1.5], ["a.py:1(plan)", 2.0, 1.0]]}  # fmt: skip
    assert per_iteration(after, after)["by_own_ms"] == [] and per_iteration(None, after)["iterations"] == 30
    cell = {"config": "ddtree B=32", "batch": 1, "step_wall_ms": 9.5, "host_profile": profile}
    table = step_profile.host_profile_markdown([cell, {"config": "ar", "batch": 1, "host_profile": None}])
    assert table[1].startswith("Python functions of ddtree B=32, batch 1, benchmark prompts (20 decode iterations")
    assert "own times of all functions: 2.50 ms per iteration" in table[1]
    assert table[-2:] == ["| `c.py:3(sample)` | 1 | 1.500 |", "| `a.py:1(plan)` | 2 | 1.000 |"]


def test_an_ab_variable_measures_each_ddtree_configuration_again_with_it_set():
    """``--ab-env SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0``: a switch's before and after in one run, each
    variant right after its configuration; AR and DFLASH are measured once."""
    args = step_profile.parse_args(["--model-path", "m", "--draft-model-path", "d", "--out", "o", "--budgets", "16,32",
                                    "--ab-env", "SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0"])[0]  # fmt: skip
    variants = step_profile.with_ab_variants(side_by_side.configurations(args), args.ab_env)
    assert list(variants) == ["ar", "dflash", "ddtree B=16", "ddtree B=16 SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0",
                              "ddtree B=32", "ddtree B=32 SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0"]  # fmt: skip
    launch_args, extra = variants["ddtree B=32 SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0"]
    assert launch_args == variants["ddtree B=32"][0] and variants["ddtree B=32"][1] == {}
    assert step_profile.server_env("ddtree B=32 SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN=0", args, extra) == {
        "SGLANG_DDTREE_PROFILE_STEPS": "1", "SGLANG_DDTREE_TRACE_RANGES": "1",
        "SGLANG_DDTREE_FLASHINFER_SYNC_FREE_PLAN": "0"}  # fmt: skip


def test_each_width_is_measured_by_an_auto_server_forced_to_it_and_the_cells_make_the_auto_table(tmp_path):
    """``--widths``: one ``ddtree W=w`` server per width, whose table leaves no other choice (checked against the
    policy itself); ``--write-step-table``'s file is what ``--budget auto`` loads."""
    from sglang_ddtree.tree.budget_policy import BudgetPolicy, load_step_time_table

    args = step_profile.parse_args(["--model-path", "m", "--draft-model-path", "d", "--out", "o", "--algos", "ddtree",
                                    "--widths", "1,4,9", "--write-step-table", "t.json"])[0]  # fmt: skip
    configs = step_profile.forced_width_configurations(args, tmp_path)
    assert list(configs) == ["ddtree W=1", "ddtree W=4", "ddtree W=9"]
    for width, launch_args in zip((1, 4, 9), configs.values()):
        assert launch_args[-4:-1] == ["--budget", "auto", "--step-time-table"]
        table = load_step_time_table(launch_args[-1])
        policy = BudgetPolicy(table, table.widths, decisions_in_flight=0, probe_interval=10**6)
        policy.observe(torch.full((8, 8), -0.01), 9, torch.full((8, 8), -1))  # confident trees of 8 nodes
        assert table.widths == [1, 4, 9] and policy.width() == width
    cells = [{"config": f"ddtree W={w}", "batch": bs, "step_wall_ms": 1.0 + w + 10 * bs} for w in (1, 4, 9)
             for bs in (1, 8)]  # fmt: skip
    report = {"meta": {"date": "d", "commit": "c", "gpu": "H200", "model_path": "m"}, "cells": cells}
    (tmp_path / "auto.json").write_text(json.dumps(step_profile.step_time_table(report, [1, 4, 9], [1, 8])))
    written = load_step_time_table(str(tmp_path / "auto.json"))
    assert written.row(1).tolist() == [12.0, 15.0, 20.0] and written.row(8).tolist() == [82.0, 85.0, 90.0]


def test_a_simulated_cell_says_so_in_the_report():
    report = {"meta": {"date": "d", "commit": "c", "gpu": "g", "model_path": "m", "max_new_tokens": 8},
              "cells": [{"config": "ddtree B=32", "batch": 1, "tau": 1.903, "simulated_tau": 1.9, "step_wall_ms": 4.5,
                         "gpu_phase_ms": None, "traced": {}}]}  # fmt: skip
    assert "| ddtree B=32 | 1 | benchmark | 1.903 (simulated, mean 1.9) | 4.50 |" in step_profile.markdown(report)


@pytest.mark.slow
def test_a_traced_ar_step_on_the_cpu_engine_is_split_into_sglangs_scheduler_functions(tmp_path):
    """The function names ``bench.step_trace`` accounts are SGLang 0.5.17's: on a real server's trace each traced
    iteration is mostly ``run_batch`` (the CPU engine computes synchronously inside it), and the parts add up."""
    from argparse import Namespace

    from sglang_ddtree.serving import free_port, launched_server
    from tiny_models import TinyShape, make_qwen3_target

    target = make_qwen3_target(str(tmp_path / "qwen3"), TinyShape(num_layers=2, vocab_size=64))
    flags = ["--device", "cpu", "--attention-backend", "torch_native", "--mem-fraction-static", "0.3",
             "--max-total-tokens", "4096", "--disable-cuda-graph"]  # fmt: skip
    prompts = [{"id": f"p{i}", "dataset": "ids", "input_ids": [5 + i, 6, 7, 8]} for i in range(2)]
    args = Namespace(max_new_tokens=12, trace_steps=3, ignore_eos=True, simulate_tau={}, sync_debug=False,
                     host_profile=False)
    env = step_profile.server_env("ar", args)
    with launched_server(["--algo", "ar", "--model-path", target, *flags], free_port(), env=env) as url:
        cell = step_profile.profile_cell(url, "ar", prompts, 1, args, tmp_path / "out", phases=False)
    assert cell["requests"] == 2 and cell["step_wall_ms"] > 0 and cell["tau"] is None
    traced = cell["traced"]
    assert traced["steps"] >= 2, traced
    parts = traced["scheduler_ms"]
    assert max(parts, key=parts.get) == "run_batch"
    assert parts["get_next_batch_to_run"] > 0 and parts["process_batch_result"] > 0 and parts["recv_requests"] > 0
    for step in step_trace.account_steps(step_trace.load_trace(traced["trace"])):  # decode steps only
        assert sum(step.scheduler.values()) == pytest.approx(step.wall)
    assert "DECODE" in traced["trace"]
    # SGLANG_DDTREE_TRACE_RANGES=1: SGLang's target forward, inside run_batch, is a range of its own ...
    assert 0 < traced["worker_ms"]["target_forward"] <= parts["run_batch"]
    assert cell["simulated_tau"] is None
    # ... and, untraced, host-timed per scheduler iteration: one target forward per run_batch, inside it
    host = cell["host_ms_per_iteration"]
    assert host["iterations"] >= 12 and host["run_batch"]["calls"] == 1
    assert 0.9 <= host["target_forward"]["calls"] <= 1 and 0 < host["target_forward"]["ms"] < host["run_batch"]["ms"]
    text = step_profile.markdown({"meta": {"date": "d", "commit": "c", "gpu": "g", "model_path": "m",
                                           "max_new_tokens": 12}, "cells": [cell]})  # fmt: skip
    assert f"| ar | 1 | benchmark | {host['iterations']} | " in text and "target_forward" in text


def test_run_batchs_range_opens_after_sglangs_profiler_step_so_no_range_spans_two_profilers(monkeypatch):
    """``profile_by_stage`` stops one torch profiler and starts the next inside ``run_batch`` (its first call, the
    profiler step): a ``spec.run_batch`` range entered before it and left after it corrupted the CPU engine's heap
    (the traced test above aborted). The range opens after the step and closes when run_batch returns; the host
    time still covers the whole call."""
    import contextlib

    from sglang.srt.utils import nvtx_utils

    from sglang_ddtree.profiling import ddtree_trace_ranges as ranges

    events = []

    @contextlib.contextmanager
    def recorded_range(name, **kwargs):
        events.append(f"enter {name}")
        yield
        events.append(f"exit {name}")

    monkeypatch.setattr(nvtx_utils, "profile_range", recorded_range)
    monkeypatch.setattr(ranges.HOST_RANGES, "add", lambda name, seconds: events.append(f"host time {name}"))

    def run_batch(batch):
        events.append("profiler step: one profiler stops, the next starts")
        ranges._open_after_profiler_step(None, "profiler manager", batch)
        events.append("forward")
        return "result"

    assert ranges._timed_after_profiler_step("run_batch")(run_batch, "batch") == "result"
    assert events == ["profiler step: one profiler stops, the next starts", "enter spec.run_batch", "forward",
                      "exit spec.run_batch", "host time run_batch"]  # fmt: skip
    events.clear()
    ranges._open_after_profiler_step(None, "profiler manager", "batch")  # a profiler step outside run_batch
    assert events == [] and ranges._AFTER_PROFILER_STEP == []

    registered = []
    monkeypatch.setenv(ranges.TRACE_RANGES_ENV, "1")
    ranges.register(SimpleNamespace(register=lambda target, hook, kind: registered.append((target, kind))),
                    SimpleNamespace(AFTER="after", AROUND="around"))  # fmt: skip
    assert (ranges._PROFILER_STEP, "after") in registered
    module, cls, method = ranges._PROFILER_STEP.rsplit(".", 2)
    assert hasattr(getattr(importlib.import_module(module), cls), method)  # in the pinned SGLang


def test_the_decode_trace_starts_one_decode_batch_after_the_one_that_ends_the_prefill_trace():
    """By stage, SGLang stops the prefill trace and starts the decode trace inside one ``run_batch``, whose own
    profiler range then ends under the new profiler (the traced AR test's scheduler aborted on a corrupted heap):
    that batch only stops the prefill trace; every other profiler step is SGLang's."""
    from sglang_ddtree.profiling import ddtree_trace_ranges as ranges

    calls = []
    manager = SimpleNamespace(profile_by_stage=True, profiler_decode_ct=0, profile_in_progress=True,
                              _stop_profile=lambda stage: calls.append(f"stop {stage.name}"))  # fmt: skip
    decode, prefill = (SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda d=d: d)) for d in (True, False))
    step = ranges._start_the_decode_trace_outside_the_run_batch_that_ends_the_prefill_trace

    def sglangs_step(manager, batch):
        calls.append("sglang's step")

    step(sglangs_step, manager, decode)
    assert calls == ["stop EXTEND"]
    manager.profile_in_progress = False  # the next decode batch: SGLang starts the decode trace
    for batch in (decode, prefill):
        calls.clear()
        step(sglangs_step, manager, batch)
        assert calls == ["sglang's step"]


def test_reports_name_the_commit_the_caller_gives_over_what_git_says(monkeypatch):
    """The GPU machine's copy of .git can name an older commit than the tree it runs."""
    from bench.provenance import COMMIT_ENV, checkout_commit

    monkeypatch.delenv(COMMIT_ENV, raising=False)
    from_git = checkout_commit()
    assert from_git == "?" or len(from_git.split("+")[0]) >= 7
    monkeypatch.setenv(COMMIT_ENV, "abc1234")
    assert checkout_commit() == "abc1234"


def test_prompts_of_a_given_length_repeat_each_prompt_to_exactly_that_many_tokens():
    """``--prompt-lengths``: the step's growth with context is measured on the benchmark prompts, each repeated and
    cut to the length, so that a batch of them shares no prefix in the cache."""
    prompts = [{"id": "a", "dataset": "d", "input_ids": [1, 2, 3]}, {"id": "b", "dataset": "d", "input_ids": [7, 8]}]
    long = step_profile.prompts_of_length(prompts, 7)
    assert [p["input_ids"] for p in long] == [[1, 2, 3, 1, 2, 3, 1], [7, 8, 7, 8, 7, 8, 7]]
    assert [p["id"] for p in long] == ["a@7", "b@7"]
    assert step_profile.prompts_of_length(prompts, 2)[0]["input_ids"] == [1, 2]
    args = step_profile.parse_args(["--model-path", "m", "--out", "o", "--algos", "ar",
                                    "--prompt-lengths", "128,2048"])[0]  # fmt: skip
    assert args.prompt_lengths == [128, 2048]
    cell = {"config": "ar", "batch": 8, "prompt_tokens": 2048, "tau": None, "step_wall_ms": 1.5,
            "host_ms_per_iteration": None}  # fmt: skip
    report = {"meta": {"date": "d", "commit": "c", "gpu": "H200", "model_path": "m", "max_new_tokens": 8},
              "cells": [cell]}
    assert "| ar | 8 | 2048 | – | 1.50 | – |" in step_profile.markdown(report)


def test_every_traced_function_is_one_sglang_0_5_17_defines():
    """A function SGLang renamed or moved would silently drop out of the host ranges."""
    import importlib

    from sglang_ddtree.profiling.ddtree_trace_ranges import TRACED_FUNCTIONS

    missing = []
    for name, target in TRACED_FUNCTIONS.items():
        module_path, _, attributes = target, "", []
        while module_path:
            try:
                owner = importlib.import_module(module_path)
                break
            except ModuleNotFoundError:
                module_path, _, attribute = module_path.rpartition(".")
                attributes.insert(0, attribute)
        for attribute in attributes:
            owner = getattr(owner, attribute, None)
        if not callable(owner):
            missing.append(f"{name}: {target}")
    assert not missing, missing
