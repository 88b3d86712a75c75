"""The side-by-side benchmark's arguments, metrics and report, on recorded requests (no server)."""

import json

import pytest

from bench import side_by_side
from bench.side_by_side import RequestRecord


def record(config, prompt_id, *, start=0.0, first=0.1, end=1.1, tokens=11, verifies=0, histogram=(), ids=(),
           temperature=0.0, concurrency=1, dataset="mt_bench"):  # fmt: skip
    return RequestRecord(config=config, dataset=dataset, prompt_id=prompt_id, temperature=temperature,
                         concurrency=concurrency, start=start, first_token=first, end=end, completion_tokens=tokens,
                         verify_ct=verifies, accept_histogram=list(histogram), output_ids=list(ids))  # fmt: skip


RECORDS = [
    record("ar", "mt_bench/81", end=1.1, ids=[5, 6, 7, 8]),
    record("ar", "mt_bench/82", end=2.1, ids=[9, 9, 9, 9]),
    # 10 tokens after the first in 0.5 s: 20 tok/s decode (AR: 10 tok/s); 11 tokens in 4 verifies.
    record("ddtree B=32", "mt_bench/81", end=0.6, verifies=4, histogram=[1, 1, 1, 1], ids=[5, 6, 7, 8]),
    record("ddtree B=32", "mt_bench/82", end=0.6, verifies=4, histogram=[0, 2, 2], ids=[9, 9, 4, 9]),
    record("mtp", "mt_bench/81", end=0.85, verifies=5, histogram=[0, 5], ids=[5, 6, 7, 8]),
    record("mtp", "mt_bench/82", end=0.85, verifies=5, histogram=[0, 5], ids=[9, 9, 9, 9]),
]


def test_cells_report_median_latencies_tau_histogram_throughput_and_speedups():
    rows = {r["config"]: r for r in side_by_side.summarize(RECORDS)}
    ar, ddtree, mtp = rows["ar"], rows["ddtree B=32"], rows["mtp"]
    assert ar["requests"] == 2 and ar["tau"] is None
    assert ar["ttft_s"] == pytest.approx(0.1)
    assert ar["tpot_s"] == pytest.approx(0.15)  # median of 0.1 and 0.2 s per token after the first
    assert ar["decode_tok_s"] == pytest.approx(7.5)  # median of 10 and 5 tok/s
    assert ar["output_tok_s"] == pytest.approx(22 / 2.1)
    assert ddtree["tau"] == pytest.approx(22 / 8) and ddtree["accept_histogram"] == [1, 3, 3, 1]
    assert ddtree["decode_tok_s"] == pytest.approx(20.0)
    assert ddtree["speedup_vs_ar"] == pytest.approx(20.0 / 7.5)
    assert ddtree["speedup_vs_mtp"] == pytest.approx(20.0 / mtp["decode_tok_s"])
    assert mtp["speedup_vs_mtp"] == pytest.approx(1.0)


def test_greedy_divergence_is_reported_with_position_and_ar_margin():
    ar_top2 = {"mt_bench/82": [(-0.1, -3.0), (-0.2, -2.0), (-0.7, -0.75), (-0.1, -4.0)]}
    assert side_by_side.greedy_divergences(RECORDS, ar_top2) == [
        {"config": "ddtree B=32", "prompt_id": "mt_bench/82", "concurrency": 1, "position": 2,
         "ar_top2_margin": pytest.approx(0.05)},
    ]  # fmt: skip


def test_greedy_outputs_are_compared_at_the_same_concurrency_and_ar_with_itself():
    """At concurrency 8 AR itself took another path at a near tie (position 1): the DDTree output that follows
    it is not a divergence, AR's own change is listed (the noise floor), and a margin is given only where
    AR's logprob pass (top-1 tokens 5, 6, 7, 8) followed the reference up to the divergence."""
    at_8 = [
        record("ar", "mt_bench/81", ids=[5, 4, 4, 4], concurrency=8),
        record("ddtree B=32", "mt_bench/81", verifies=4, ids=[5, 4, 4, 4], concurrency=8),
        record("ddtree B=32", "mt_bench/81", verifies=4, ids=[5, 4, 4, 9], concurrency=1),
    ]
    ar_top2 = {"mt_bench/81": [(-0.1, -3.0, 5), (-0.5, -0.52, 6), (-0.2, -2.0, 7), (-0.3, -1.0, 8)]}
    found = side_by_side.greedy_divergences([RECORDS[0], *at_8], ar_top2)
    assert found == [
        {"config": "ar", "prompt_id": "mt_bench/81", "concurrency": 8, "position": 1, "ar_top2_margin": pytest.approx(0.02)},
        {"config": "ddtree B=32", "prompt_id": "mt_bench/81", "concurrency": 1, "position": 1,
         "ar_top2_margin": pytest.approx(0.02)},
    ]  # fmt: skip
    off_path = {"mt_bench/81": [(-0.1, -3.0, 5), (-0.5, -0.52, 4), (-0.2, -2.0, 7), (-0.3, -1.0, 8)]}
    late = [record("ddtree B=32", "mt_bench/81", verifies=4, ids=[5, 6, 7, 9])]
    assert side_by_side.greedy_divergences([RECORDS[0], *late], off_path)[0]["ar_top2_margin"] is None


def test_report_writes_json_markdown_and_plots(tmp_path):
    meta = {"date": "2026-11-29", "commit": "abc1234", "gpu": "H200", "model_path": "m", "tp": 1, "max_new_tokens": 11}
    report = side_by_side.write_report(tmp_path, meta, RECORDS, {})
    saved = json.loads((tmp_path / "side_by_side.json").read_text())
    assert saved["meta"] == meta and len(saved["requests"]) == len(RECORDS) and len(saved["summary"]) == 3
    markdown = (tmp_path / "side_by_side.md").read_text()
    assert "| ddtree B=32 | mt_bench | 0 | 1 | 2 | 2.75 | 20.0 |" in markdown
    assert "| 2.67x | 1.50x |" in markdown  # DDTree's decode speedups vs AR and vs MTP
    assert "| ar | mt_bench | 0 | 1 | 2 | – |" in markdown  # AR has no tau
    assert "Greedy divergences from AR: 1" in markdown
    assert report["plots"] == ["throughput_mt_bench_T0.png", "acceptance_mt_bench_T0.png", "ddtree_budget_sweep.png"]
    for name in report["plots"]:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_a_resumed_run_keeps_the_measured_configurations_and_ar_margins(tmp_path):
    """``--resume``: a run cut short (the report is rewritten after every configuration) continues with the
    configurations it has not measured, still judging divergences against AR's recorded margins."""
    ar_top2 = {"mt_bench/82": [(-0.1, -3.0), (-0.2, -2.0), (-0.7, -0.75), (-0.1, -4.0)]}
    commands = {"ar": ["python", "-m", "sglang_ddtree.launch", "--algo", "ar"]}
    side_by_side.write_report(tmp_path, {"commands": commands}, RECORDS, ar_top2)
    records, restored_top2, restored_commands, restored_profiles = side_by_side.resumed(tmp_path)
    assert records == RECORDS and restored_commands == commands
    assert side_by_side.greedy_divergences(records, restored_top2) == side_by_side.greedy_divergences(RECORDS, ar_top2)
    assert restored_profiles == []
    assert side_by_side.resumed(tmp_path / "elsewhere") == ([], {}, {}, [])


def test_each_ddtree_budget_is_its_own_configuration_and_shared_flags_follow_the_double_dash():
    args, shared = side_by_side.parse_args(
        ["--model-path", "M", "--draft-model-path", "D", "--algos", "ar,dflash,ddtree", "--budgets", "16,64",
         "--tp", "2", "--out", "o", "--", "--attention-backend", "flashinfer"]
    )  # fmt: skip
    assert shared == ["--attention-backend", "flashinfer"]
    assert side_by_side.configurations(args) == {
        "ar": ["--algo", "ar", "--model-path", "M", "--tp", "2"],
        "dflash": ["--algo", "dflash", "--model-path", "M", "--tp", "2", "--draft-model-path", "D"],
        "ddtree B=16": ["--algo", "ddtree", "--model-path", "M", "--tp", "2", "--draft-model-path", "D", "--budget", "16"],
        "ddtree B=64": ["--algo", "ddtree", "--model-path", "M", "--tp", "2", "--draft-model-path", "D", "--budget", "64"],
    }  # fmt: skip


def test_the_auto_budget_is_one_configuration_with_its_step_time_table_if_one_is_given():
    args, _ = side_by_side.parse_args(["--model-path", "M", "--draft-model-path", "D", "--algos", "ddtree",
                                       "--budgets", "32,auto", "--step-time-table", "T.json", "--out", "o"])  # fmt: skip
    assert side_by_side.configurations(args) == {
        "ddtree B=32": ["--algo", "ddtree", "--model-path", "M", "--tp", "1", "--draft-model-path", "D", "--budget", "32"],
        "ddtree auto": ["--algo", "ddtree", "--model-path", "M", "--tp", "1", "--draft-model-path", "D",
                        "--budget", "auto", "--step-time-table", "T.json"],
    }  # fmt: skip
    args, _ = side_by_side.parse_args(["--model-path", "M", "--draft-model-path", "D", "--algos", "ddtree",
                                       "--budgets", "auto", "--out", "o"])  # fmt: skip
    assert side_by_side.configurations(args) == {  # the server measures its own step times
        "ddtree auto": ["--algo", "ddtree", "--model-path", "M", "--tp", "1", "--draft-model-path", "D", "--budget", "auto"],
    }  # fmt: skip


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algos", "ar,beam"], "unknown algorithm(s) beam; choose from ar, mtp, dflash, ddtree"),
        (["--algos", "ddtree"], "dflash and ddtree need --draft-model-path"),
        (["--algos", "ar", "--concurrency", "0"], "--concurrency and --budgets take positive integers"),
        (["--algos", "ar", "--budgets", "16,x"],
         "argument --budgets: '16,x' is not a comma-separated list of budgets (integers or auto)"),
        (["--algos", "ar", "--budgets", "16", "--step-time-table", "T.json"], "--step-time-table is the table of --budgets auto"),
        (["--algos", "ar", "--url", "http://127.0.0.1:30000"], "--url takes CONFIG=URL, e.g. 'ddtree B=32=http://127.0.0.1:30000'"),
        (["--algos", "ar", "--simulate-tau", "ar=3"], "--simulate-tau names speculative algorithms of --algos (mtp, dflash, ddtree)"),
        (["--algos", "ar", "--datasets", "random"], "--datasets random needs --num-prompts and --random-prompt-len of at least 1"),
        (["--algos", "ar", "--simulate-tau-by-width", "mtp=2:1.5"],
         "--simulate-tau-by-width: 'mtp=2:1.5' is not DDTREE_CONFIG=WIDTH:MEAN,..., e.g. 'ddtree auto=2:1.5,17:4.06'"),
        (["--algos", "ddtree", "--draft-model-path", "D", "--budgets", "16", "--simulate-tau-by-width",
          "ddtree auto=2:1.5"], "--simulate-tau-by-width names ddtree auto: not a configuration of this run "
         "(ddtree B=16)"),
        (["--algos", "ddtree", "--draft-model-path", "D", "--budgets", "auto", "--simulate-tau-by-width",
          "ddtree auto=2:3"], "--simulate-tau-by-width: SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH='2:3': expected "
         "WIDTH:MEAN,... with each width >= 2 and its mean between 1 and the width, got '2:3'"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        side_by_side.parse_args(["--model-path", "M", "--out", "o", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"python -m bench.side_by_side: error: {message}\n"


def test_simulated_configurations_get_sglangs_knob_and_the_report_says_so():
    args, _ = side_by_side.parse_args(["--model-path", "M", "--draft-model-path", "D", "--out", "o", "--algos",
                                       "ar,mtp,ddtree", "--budgets", "16,32",
                                       "--simulate-tau", "mtp=3.6,ddtree=4,ddtree B=16=3.5"])  # fmt: skip
    assert args.simulate_tau == {"mtp": 3.6, "ddtree": 4.0, "ddtree B=16": 3.5}
    assert side_by_side.simulation_env("ar", args.simulate_tau) == {}
    assert side_by_side.simulation_env("mtp", args.simulate_tau) == {"SGLANG_SIMULATE_ACC_LEN": "3.6"}
    assert side_by_side.simulation_env("ddtree B=32", args.simulate_tau) == {"SGLANG_SIMULATE_ACC_LEN": "4.0"}
    assert side_by_side.simulation_env("ddtree B=16", args.simulate_tau) == {"SGLANG_SIMULATE_ACC_LEN": "3.5"}
    text = side_by_side.markdown({"simulated_tau": args.simulate_tau}, [], [])
    assert ("**Simulated acceptance (cost only, outputs are not the target's)**: mean tau mtp 3.6, ddtree 4, "
            "ddtree B=16 3.5") in text
    assert "Simulated" not in side_by_side.markdown({}, [], [])


def test_random_prompts_are_seeded_token_ids_of_the_asked_length(tmp_path):
    from tiny_models import TinyShape, make_qwen3_target

    target = make_qwen3_target(str(tmp_path / "qwen3"), TinyShape(num_layers=1, vocab_size=64))
    first = side_by_side.random_prompts(3, 1024, target)
    assert [len(p["input_ids"]) for p in first] == [1024] * 3 and first == side_by_side.random_prompts(3, 1024, target)
    assert all(0 <= t < 64 for p in first for t in p["input_ids"]) and first[0]["input_ids"] != first[1]["input_ids"]


def test_a_configuration_the_launcher_refuses_stops_the_run_before_any_server_starts(tmp_path):
    """MTP on a target without MTP layers: the launcher's own reason, in one line, before anything is measured."""
    import subprocess
    import sys

    from tiny_models import TinyShape, make_qwen3_target

    target = make_qwen3_target(str(tmp_path / "qwen3"), TinyShape(num_layers=2))
    result = subprocess.run([sys.executable, "-m", "bench.side_by_side", "--model-path", target, "--algos", "ar,mtp",
                             "--out", str(tmp_path / "out"), "--wheel-dir", str(tmp_path / "wheels")],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("python -m bench.side_by_side: error: configuration 'mtp' is refused: sglang_ddtree.launch: error:")
    assert "needs a target that ships MTP layers" in line
    assert not (tmp_path / "out").exists()


def test_runs_split_by_dataset_merge_into_the_report_of_one_run(tmp_path):
    """One dataset per GPU: the merged report equals the report of a single run over both datasets."""
    from bench.merge_side_by_side import MergeError, merge

    humaneval = [record(r.config, r.prompt_id.replace("mt_bench", "humaneval"), dataset="humaneval", end=r.end,
                        verifies=r.verify_ct, histogram=r.accept_histogram, ids=r.output_ids) for r in RECORDS]  # fmt: skip
    top2 = {"mt_bench/82": [(-0.1, -3.0)] * 4, "humaneval/82": [(-0.1, -0.2)] * 4}
    side_by_side.write_report(tmp_path / "gpu0", {"commit": "abc"}, RECORDS, {"mt_bench/82": top2["mt_bench/82"]})
    side_by_side.write_report(tmp_path / "gpu1", {"commit": "abc"}, humaneval, {"humaneval/82": top2["humaneval/82"]})
    merged = merge([tmp_path / "gpu0", tmp_path / "gpu1"], tmp_path / "merged")
    single = side_by_side.write_report(tmp_path / "single", {"commit": "abc"}, RECORDS + humaneval, top2)
    assert merged["summary"] == single["summary"] and merged["divergences"] == single["divergences"]
    assert [p["datasets"] for p in merged["meta"]["parts"]] == [["mt_bench"], ["humaneval"]]
    with pytest.raises(MergeError, match="both measured mt_bench"):
        merge([tmp_path / "gpu0", tmp_path / "single"], tmp_path / "refused")


def test_ar_logprob_pass_keeps_the_chosen_tokens_beside_the_top_two():
    """The untimed AR pass parses SGLang's ``/generate`` logprob response (entries ``(logprob, token id,
    text)``) into ``(top-1, top-2, chosen token)`` per position, the path the divergence check follows."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    response = {"output_ids": [7, 3], "meta_info": {"output_top_logprobs": [
        [[-0.1, 7, None], [-2.5, 9, None]], [[-0.4, 3, None], [-0.45, 8, None]]]}}  # fmt: skip
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps(response).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        top2 = side_by_side.ar_top2_logprobs(url, [{"id": "mt_bench/81", "input_ids": [1, 2]}], max_new_tokens=2)
    finally:
        server.shutdown()
    assert top2 == {"mt_bench/81": [(-0.1, -2.5, 7), (-0.4, -0.45, 3)]}
    assert requests[0]["top_logprobs_num"] == 2 and requests[0]["sampling_params"]["temperature"] == 0


def test_ddtree_step_phases_are_reported_per_cell(tmp_path):
    """``--profile-steps``: each DDTree cell's mean GPU ms per decode-step phase, in the JSON and the Markdown."""
    from sglang_ddtree.profiling.ddtree_step_profile import PHASES

    profile = {"config": "ddtree B=32", "datasets": ["mt_bench"], "temperature": 0.0, "concurrency": 1, "steps": 40,
               "phase_ms": dict(zip(PHASES, [1.0, 0.5, 0.25, 2.0, 0.25]))}  # fmt: skip
    side_by_side.write_report(tmp_path, {}, RECORDS, {}, [profile])
    assert side_by_side.resumed(tmp_path)[3] == [profile]
    assert "| ddtree B=32 | mt_bench | 0 | 1 | 40 | 1.000 | 0.500 | 0.250 | 2.000 | 0.250 | 4.000 |" in (
        tmp_path / "side_by_side.md").read_text()
    args, _ = side_by_side.parse_args(["--model-path", "m", "--draft-model-path", "d", "--out", "o", "--profile-steps"])
    assert args.profile_steps


def test_an_auto_cells_step_phases_are_split_by_verify_width(monkeypatch):
    """Run 91's auto cell stepped in 80.4 ms on average over widths 8, 16 and 33: the profile keeps each width's
    phases (the server's totals per width, differenced over the cell), so a slow width shows as itself, and each
    row's median and slowest step, so one slow step shows as an outlier rather than as a slow width."""
    from sglang_ddtree.profiling import ddtree_step_profile
    from sglang_ddtree.profiling.ddtree_step_profile import PHASES, StepProfile, phase_means_by_width, step_ms_spread

    monkeypatch.setenv(ddtree_step_profile.PROFILE_STEPS_ENV, "1")
    profile = StepProfile()

    def step(width: int, phase_ms: list[float]) -> None:
        timer = profile.start("cpu")
        timer.marks = [0.0] + [sum(phase_ms[: i + 1]) / 1e3 for i in range(len(PHASES))]  # host-clock marks, s
        profile.finish(timer, width)

    step(16, [5.0, 0.0, 1.0, 30.0, 0.5])
    before = profile.as_dict()
    step(16, [5.0, 0.0, 1.0, 34.0, 0.5])
    step(8, [5.0, 0.0, 7.0, 70.0, 0.5])
    step(16, [5.0, 0.0, 1.0, 36.0, 0.5])
    step(16, [5.0, 0.0, 1.0, 300.0, 0.5])  # one step 260 ms slower than the others
    after = profile.as_dict()
    assert after["steps"] == 5 and {w: c["steps"] for w, c in after["by_width"].items()} == {"8": 1, "16": 4}
    cells = phase_means_by_width(before, after)
    assert {w: c["steps"] for w, c in cells.items()} == {"8": 1, "16": 3}
    assert cells["16"]["phase_ms"]["verify"] == pytest.approx((34.0 + 36.0 + 300.0) / 3)
    assert cells["8"]["phase_ms"]["verify_tensors"] == pytest.approx(7.0)
    spread = step_ms_spread(before, after)
    assert spread["16"] == {"steps": 3, "median_ms": pytest.approx(42.5), "max_ms": pytest.approx(306.5)}
    assert spread["all"]["steps"] == 4 and spread["all"]["median_ms"] == pytest.approx((42.5 + 82.5) / 2)

    row = {"config": "ddtree auto", "datasets": ["random"], "temperature": 0.0, "concurrency": 16, "steps": 4,
           "phase_ms": ddtree_step_profile.phase_means(before, after), "phase_ms_by_width": cells,
           "step_ms_spread": spread}  # fmt: skip
    text = side_by_side.step_profile_markdown([row])
    assert ("| ddtree auto · width 8 | random | 0 | 16 | 1 | 5.000 | 0.000 | 7.000 | 70.000 | 0.500 | 82.500 | "
            "82.500 | 82.500 |") in text
    assert "| ddtree auto · width 16 | random | 0 | 16 | 3 |" in text and "| 42.500 | 306.500 |" in text
    assert text.index("· width 8 |") < text.index("· width 16 |")
    single = {**row, "phase_ms_by_width": {"16": cells["16"]}}
    assert "· width" not in side_by_side.step_profile_markdown([single]).split("\n", 3)[-1]  # one width: no split
    earlier = {key: value for key, value in row.items() if key != "step_ms_spread"}  # a report from before
    assert "| 82.500 | – | – |" in side_by_side.step_profile_markdown([earlier])


def test_the_step_profile_keeps_only_its_last_steps_one_by_one(monkeypatch):
    """The steps kept one by one are bounded (the profile lands in every ``/server_info``); a spread over more
    steps than were kept says over how many it was taken."""
    from sglang_ddtree.profiling import ddtree_step_profile
    from sglang_ddtree.profiling.ddtree_step_profile import PHASES, StepProfile, step_ms_spread

    monkeypatch.setenv(ddtree_step_profile.PROFILE_STEPS_ENV, "1")
    monkeypatch.setattr(ddtree_step_profile, "RECENT_STEPS", 3)
    profile = StepProfile()
    before = profile.as_dict()
    for ms in (10.0, 20.0, 30.0, 40.0, 50.0):
        timer = profile.start("cpu")
        timer.marks = [0.0] * len(PHASES) + [ms / 1e3]
        profile.finish(timer, 33)
    after = profile.as_dict()
    assert [entry[0] for entry in after["recent"]] == [2, 3, 4]
    assert step_ms_spread(before, after)["all"] == {"steps": 3, "median_ms": pytest.approx(40.0),
                                                    "max_ms": pytest.approx(50.0)}  # fmt: skip


def offline_servers_and_prompts(monkeypatch) -> None:
    """``side_by_side.main`` without servers, tokenizers or prompt wheels: one two-token prompt per dataset, every
    configuration launchable, every server at one URL."""
    import contextlib

    from bench import prompts as prompt_sets

    monkeypatch.setattr(side_by_side, "refused_configuration", lambda configs, shared: None)
    monkeypatch.setattr(prompt_sets, "load", lambda names, wheel_dir: [{"id": "p", "dataset": names[0], "prompt": "x"}])
    monkeypatch.setattr(side_by_side, "tokenized_prompts",
                        lambda rows, path: [{**r, "input_ids": [1, 2]} for r in rows])  # fmt: skip
    monkeypatch.setattr(side_by_side, "launched_server", lambda *a, **k: contextlib.nullcontext("http://server"))


def test_every_cell_is_warmed_up_at_its_own_concurrency_and_temperature_before_it_is_measured(tmp_path, monkeypatch):
    """One-time costs of a batch shape (a first concurrency-8 cell once took 1.08 s to its first token) fall in
    an unmeasured warm-up of that shape; every cell then starts from a flushed prefix cache."""
    calls = []
    offline_servers_and_prompts(monkeypatch)
    monkeypatch.setattr(side_by_side, "ar_top2_logprobs", lambda url, prompts, n: {})
    monkeypatch.setattr(side_by_side.urllib.request, "urlopen", lambda request, timeout: calls.append("flush"))

    def fake_run_cell(url, config, prompts, temperature, concurrency, max_new_tokens, ignore_eos=False):
        kind = "warm-up" if prompts[0]["dataset"] == "warmup" else "measure"
        calls.append((kind, temperature, concurrency, len(prompts)))
        tokens.append((config, kind, max_new_tokens, ignore_eos))
        return []

    tokens = []
    monkeypatch.setattr(side_by_side, "run_cell", fake_run_cell)
    monkeypatch.setattr(side_by_side, "write_report", lambda *a: (tmp_path / "side_by_side.md").write_text(""))
    side_by_side.main(["--model-path", "m", "--algos", "ar", "--concurrency", "1,8", "--temperatures", "0,1",
                       "--datasets", "mt_bench", "--out", str(tmp_path)])  # fmt: skip
    assert calls[:2] == [("warm-up", 0.0, 1, 2), "flush"]  # the server's first warm-up, at concurrency 1
    cells = calls[2:]
    assert cells == [step for t, c in [(0.0, 1), (0.0, 8), (1.0, 1), (1.0, 8)]
                     for step in [("warm-up", t, c, max(c, 2)), "flush", ("measure", t, c, 1)]]  # fmt: skip
    assert {(kind, n) for _, kind, n, _ in tokens} == {("warm-up", 32), ("measure", 256)}


def test_an_auto_budget_cell_warms_up_on_its_whole_output_length(tmp_path, monkeypatch):
    """``--budget auto`` measures its widths' step times and calibrates on its first steps at a batch size, and
    meets each (width, batch size) first there: on 32 warm-up tokens the measured cell of 16 requests still verified
    its widest trees on 20% of its steps and stalled up to 2.8 s (RESULTS run 92). Its cells' warm-up generates the
    cell's whole output length, past EOS; the server's first warm-up stays short."""
    tokens = []
    offline_servers_and_prompts(monkeypatch)
    monkeypatch.setattr(side_by_side, "flush_prefix_cache", lambda url: None)
    monkeypatch.setattr(side_by_side, "server_state", lambda url, key: {"widths": [1, 33], "steps": [0, 0]})
    monkeypatch.setattr(side_by_side, "run_cell", lambda url, config, prompts, t, c, max_new_tokens, ignore_eos=False:
                        tokens.append((prompts[0]["dataset"], c, max_new_tokens, ignore_eos)) or [])  # fmt: skip
    monkeypatch.setattr(side_by_side, "write_report", lambda *a: (tmp_path / "side_by_side.md").write_text(""))
    side_by_side.main(["--model-path", "m", "--draft-model-path", "d", "--algos", "ddtree", "--budgets", "auto",
                       "--concurrency", "16", "--temperatures", "0", "--datasets", "mt_bench", "--max-new-tokens",
                       "200", "--out", str(tmp_path)])  # fmt: skip
    assert tokens == [("warmup", 1, 32, False), ("warmup", 16, 200, True), ("mt_bench", 16, 200, False)]


def test_random_prompts_are_warmed_up_at_their_own_length_on_other_token_ids(tmp_path, monkeypatch):
    """A first 1,024-token prefill once waited 2 s after 16 requests arrived (RESULTS run 86: time to first token
    2.82 s, 1.46 in run 82) while the warm-up had prefilled only short prompts: with random prompts the warm-up
    also sends prompts of their length, drawn from another seed, so that no measured prompt is warmed."""
    import contextlib

    warmed, measured = [], []
    monkeypatch.setattr(side_by_side, "refused_configuration", lambda configs, shared: None)
    monkeypatch.setattr(side_by_side, "tokenized_prompts", lambda rows, path: [{**r, "input_ids": [7]} for r in rows])
    monkeypatch.setattr(side_by_side, "random_prompts", lambda count, length, model, tokenizer, seed=0: [
        {"id": f"random/{i}", "dataset": "random", "prompt": None, "input_ids": [100 + seed] * length}
        for i in range(count)])  # fmt: skip
    monkeypatch.setattr(side_by_side, "launched_server", lambda *a, **k: contextlib.nullcontext("http://server"))
    monkeypatch.setattr(side_by_side, "flush_prefix_cache", lambda url: None)

    def fake_run_cell(url, config, prompts, temperature, concurrency, max_new_tokens, ignore_eos=False):
        (warmed if prompts[0]["dataset"] == "warmup" else measured).append(prompts)
        return []

    monkeypatch.setattr(side_by_side, "run_cell", fake_run_cell)
    monkeypatch.setattr(side_by_side, "write_report", lambda *a: (tmp_path / "side_by_side.md").write_text(""))
    side_by_side.main(["--model-path", "m", "--draft-model-path", "d", "--algos", "mtp", "--concurrency", "4",
                       "--temperatures", "0", "--datasets", "random", "--num-prompts", "4", "--random-prompt-len",
                       "5", "--simulate-tau", "mtp=3.5", "--out", str(tmp_path)])  # fmt: skip
    measured_ids = {tuple(p["input_ids"]) for p in measured[0]}
    for batch in warmed:  # the server's first warm-up and the cell's own
        lengths = sorted(len(p["input_ids"]) for p in batch)
        assert lengths[0] == 1 and lengths[-1] == 5
        assert all(p["dataset"] == "warmup" and tuple(p["input_ids"]) not in measured_ids for p in batch)
    assert len(warmed) == 2


def test_rounds_send_rounds_times_concurrency_prompts_per_cell_and_simulated_runs_skip_ars_logprob_pass(
        tmp_path, monkeypatch):  # fmt: skip
    """``--rounds 2``: each cell sends its first 2 x concurrency prompts, so a cell at concurrency 1 is as long as
    one at 16 (at the user's shape, every prompt at concurrency 1 would take minutes per configuration). With
    simulated acceptance AR's untimed top-2 pass is skipped: the simulated outputs are not compared with AR's."""
    import contextlib

    measured, top2_passes = [], []
    monkeypatch.setattr(side_by_side, "refused_configuration", lambda configs, shared: None)
    monkeypatch.setattr(side_by_side, "random_prompts", lambda count, length, model, tokenizer, seed=0: [
        {"id": f"random/{i}", "dataset": "random", "prompt": None, "input_ids": [1] * length} for i in range(count)])
    monkeypatch.setattr(side_by_side, "tokenized_prompts", lambda rows, path: [{**r, "input_ids": [1]} for r in rows])
    monkeypatch.setattr(side_by_side, "launched_server", lambda *a, **k: contextlib.nullcontext("http://server"))
    monkeypatch.setattr(side_by_side, "ar_top2_logprobs", lambda url, prompts, n: top2_passes.append(url) or {})
    monkeypatch.setattr(side_by_side, "flush_prefix_cache", lambda url: None)

    def fake_run_cell(url, config, prompts, temperature, concurrency, max_new_tokens, ignore_eos=False):
        if prompts[0]["dataset"] != "warmup":
            measured.append((config, concurrency, [p["id"] for p in prompts]))
        return []

    monkeypatch.setattr(side_by_side, "run_cell", fake_run_cell)
    monkeypatch.setattr(side_by_side, "write_report", lambda *a: (tmp_path / "side_by_side.md").write_text(""))
    argv = ["--model-path", "m", "--draft-model-path", "d", "--algos", "ar,mtp", "--concurrency", "1,4",
            "--temperatures", "0", "--datasets", "random", "--num-prompts", "9", "--random-prompt-len", "3",
            "--rounds", "2", "--out", str(tmp_path)]  # fmt: skip
    side_by_side.main([*argv, "--simulate-tau", "mtp=3.5"])
    assert [(config, c, len(ids)) for config, c, ids in measured] == [("ar", 1, 2), ("ar", 4, 8), ("mtp", 1, 2),
                                                                      ("mtp", 4, 8)]  # fmt: skip
    assert measured[1][2] == [f"random/{i}" for i in range(8)] and top2_passes == []
    measured.clear()
    side_by_side.main(argv)
    assert top2_passes == ["http://server"]
    with pytest.raises(SystemExit) as exit_info:
        side_by_side.main([*argv[:-2], "--rounds", "3", "--out", str(tmp_path)])
    assert exit_info.value.code == 2


def test_a_width_table_goes_to_its_configuration_beside_sglangs_knob_and_the_report_says_so():
    """``--simulate-tau-by-width``: the auto server draws each verify's length around its width's mean; SGLang's
    knob, which must be on for any simulation, defaults to the widest width's mean."""
    args, _ = side_by_side.parse_args(["--model-path", "M", "--draft-model-path", "D", "--out", "o", "--algos",
                                       "ddtree", "--budgets", "auto,16", "--simulate-tau-by-width",
                                       "ddtree auto=2:1.5,17:4.06"])  # fmt: skip
    assert args.simulate_tau_by_width == {"ddtree auto": "2:1.5,17:4.06"}
    assert side_by_side.simulation_env("ddtree auto", args.simulate_tau, args.simulate_tau_by_width) == {
        "SGLANG_SIMULATE_ACC_LEN": "4.06", "SGLANG_DDTREE_SIMULATE_ACC_BY_WIDTH": "2:1.5,17:4.06"}
    assert side_by_side.simulation_env("ddtree B=16", args.simulate_tau, args.simulate_tau_by_width) == {}
    text = side_by_side.markdown({"simulated_tau_by_width": args.simulate_tau_by_width}, [], [])
    assert "**Simulated acceptance by verify width (cost only)**: ddtree auto 2:1.5,17:4.06" in text


def test_simulated_configurations_are_not_compared_with_ars_outputs():
    records = [record("ar", "p", ids=(1, 2, 3)), record("mtp", "p", ids=(1, 9, 9)), record("dflash", "p", ids=(1, 9))]
    assert [d["config"] for d in side_by_side.greedy_divergences(records, {}, simulated=["mtp"])] == ["dflash"]


def test_the_auto_budget_widths_of_each_cell_are_reported_as_a_histogram():
    cells = [{"temperature": 0.0, "concurrency": 8, "widths": [1, 2, 33], "steps": [30, 0, 10],
              "measured_step_ms": {"8": [1.5, 1.6, 4.0]}}]  # fmt: skip
    text = side_by_side.auto_budget_markdown(cells)
    assert "| 0 | 8 | 1: 30 (75%), 33: 10 (25%) | – | bs<=8: [1.5, 1.6, 4.0] |" in text
    assert side_by_side.auto_budget_markdown([]) == ""


def test_an_auto_cell_reports_how_many_of_its_verifies_replayed_their_widths_graphs(monkeypatch):
    """Run 91's auto server stepped in 80.4 ms where its own table priced the widths it chose at 35-67: whether
    the narrower widths replayed their graphs in the cell (or verified eagerly) is the first thing to read."""
    before = {"widths": [1, 8, 16, 33], "steps": [5, 0, 0, 2], "graph_widths": [1, 8, 16, 33],
              "graph_replays": [5, 0, 0, 2]}  # fmt: skip
    after = {"widths": [1, 8, 16, 33], "steps": [5, 16, 38, 16], "graph_widths": [1, 8, 16, 33],
             "graph_replays": [5, 16, 0, 16], "measured_step_ms": {"16": [28.1, 35.0, 39.4, 67.0]}}  # fmt: skip
    monkeypatch.setattr(side_by_side, "server_state", lambda url, key: after)
    cell = side_by_side.auto_budget_cell("http://server", 0.0, 16, before)
    assert cell["steps"] == [0, 16, 38, 14] and cell["graph_replays"] == {"1": 0, "8": 16, "16": 0, "33": 14}
    assert "| 0 | 16 | 8: 16 (24%), 16: 38 (56%), 33: 14 (21%) | 8: 16, 33: 14 | bs<=16:" in (
        side_by_side.auto_budget_markdown([cell]))
