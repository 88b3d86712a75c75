"""``python -m bench.acceptance_crossover``: from a simulated side-by-side run, each configuration's decode step,
the acceptance DDTree needs to match each baseline, and the ranking at the simulated acceptance."""

import json
import subprocess
import sys

import pytest

from bench import acceptance_crossover as crossover

# (config, concurrency) -> (TPOT s, tau): steps of 20 / 28 / 30 / 36 ms at concurrency 1 and twice that at 16.
CELLS = {
    ("ar", 1): (0.020, 1.0), ("mtp", 1): (0.008, 3.5), ("dflash", 1): (0.010, 3.0), ("ddtree B=32", 1): (0.009, 4.0),
    ("ar", 16): (0.040, 1.0), ("mtp", 16): (0.016, 3.5), ("dflash", 16): (0.020, 3.0), ("ddtree B=32", 16): (0.018, 4.0),
    ("ddtree auto", 1): (0.010, 3.6),
}  # fmt: skip
SIMULATED = {"mtp": 3.5, "dflash": 3.0, "ddtree": 4.0}


def run_report(simulated=SIMULATED) -> dict:
    summary = []
    for (config, concurrency), (tpot, tau) in CELLS.items():
        for dataset, scale in (("random", 1.0), ("other", 1.5)):  # two datasets: the median cell is the first
            for temperature in (0.0, 1.0):
                summary.append({"config": config, "dataset": dataset, "temperature": temperature,
                                "concurrency": concurrency, "tpot_s": tpot * (scale if temperature == 0 else 9),
                                "tau": tau, "output_tok_s": 100.0})  # fmt: skip
    meta = {"date": "2026-12-04", "commit": "abc1234", "gpu": "NVIDIA H200", "model_path": "qwen36_27b", "tp": 1,
            "simulated_tau": simulated}  # fmt: skip
    return {"meta": meta, "summary": summary}


def test_the_step_is_tpot_times_tau_of_the_greedy_cells():
    steps = {(e["config"], e["concurrency"]): e for e in crossover.measured_steps(run_report())}
    assert steps["ddtree B=32", 1]["step_ms"] == pytest.approx(36.0 * 1.5)  # median of 36 and 54: the upper one
    assert steps["mtp", 16]["step_ms"] == pytest.approx(56.0 * 1.5)
    assert steps["ar", 1]["simulated_tau"] is None and steps["ddtree B=32", 1]["simulated_tau"] == 4.0


def test_ddtree_must_reach_the_baselines_tau_scaled_by_its_step_ratio():
    result = crossover.crossover(run_report(), {"mtp": 3.556, "dflash": 3.1})
    needed = {(c["config"], c["concurrency"], c["baseline"]): c["tau_to_match"] for c in result["crossings"]}
    assert needed["ddtree B=32", 1, "mtp"] == pytest.approx(3.556 * 36 / 28)
    assert needed["ddtree B=32", 16, "dflash"] == pytest.approx(3.1 * 72 / 60)
    assert not any(config == "ddtree auto" for config, _, _ in needed)  # its width follows acceptance: no line


def test_the_ranking_is_decode_throughput_at_the_simulated_taus():
    ranking = {r["concurrency"]: r for r in crossover.crossover(run_report(), {"mtp": 3.556})["ranking"]}
    # concurrency 1: mtp 3.5/28 = 0.125 per ms, ddtree B=32 4/36 = 0.111, ddtree auto 3.6/36 = 0.1, dflash 0.1
    assert (ranking[1]["winner"], ranking[1]["runner_up"]) == ("mtp", "ddtree B=32")
    assert ranking[1]["margin"] == pytest.approx((3.5 / 28) / (4 / 36))
    assert ranking[16]["decode_tok_s"] == pytest.approx(16 * 3.5 / (56 * 1.5) * 1000)


def test_a_run_without_simulated_acceptance_or_without_the_baseline_cannot_answer():
    with pytest.raises(crossover.CrossoverError, match="no --simulate-tau"):
        crossover.crossover(run_report(simulated={}), {"mtp": 3.556})
    with pytest.raises(crossover.CrossoverError, match="eagle"):
        crossover.crossover(run_report(), {"eagle": 3.0})


def test_the_command_writes_table_and_plot_and_refuses_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "side_by_side.json").write_text(json.dumps(run_report()))
    command = [sys.executable, "-m", "bench.acceptance_crossover", "--run", str(run), "--headline", "mtp=3.556"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = (run / "acceptance_crossover.md").read_text()
    assert "projections" in text and "| ddtree B=32 | 1 | mtp | 3.556 | 4.57 |" in text
    assert (run / "acceptance_crossover.png").stat().st_size > 0
    assert json.loads((run / "acceptance_crossover.json").read_text())["headline_taus"] == {"mtp": 3.556}

    (run / "side_by_side.json").write_text(json.dumps(run_report(simulated={})))
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "no --simulate-tau" in refused.stderr
    missing = subprocess.run([*command[:4], str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_a_committed_report_compressed_to_json_gz_is_read_as_the_report(tmp_path):
    import gzip

    run = tmp_path / "run"
    run.mkdir()
    (run / "side_by_side.json.gz").write_bytes(gzip.compress(json.dumps(run_report()).encode()))
    done = subprocess.run([sys.executable, "-m", "bench.acceptance_crossover", "--run", str(run), "--headline",
                           "mtp=3.556"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| ddtree B=32 | 1 | mtp | 3.556 | 4.57 |" in (run / "acceptance_crossover.md").read_text()
