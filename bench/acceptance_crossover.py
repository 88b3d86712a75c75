"""Where the algorithms' lines cross: output tok/s against acceptance length, from a simulated side-by-side run.

    python -m bench.acceptance_crossover --run DIR [--headline mtp=3.56,dflash=3.1] [--out DIR]

The user's question (issue 18) at the user's shape: a ``bench.side_by_side`` run on a random-weight target with
``--simulate-tau`` measures what each algorithm's decode step costs at each concurrency, with acceptance imposed.
From each (configuration, concurrency) cell of its ``side_by_side.json`` (T = 0) this takes

- the **measured step**: the median request's decode time per verify, TPOT x tau (AR: its TPOT);
- the **projected line** (a projection, named so in every output): at acceptance length t a request commits t
  tokens per step, so ``concurrency x t / step`` output tok/s while decoding. It assumes the step does not change
  with t, which holds for a fixed verify width up to the KV growth of longer outputs; ``ddtree auto`` picks its
  width from the acceptance, so it is shown at its measured point only;
- the **crossings**: configuration C decodes as fast as baseline B (at B's headline tau t_B) from
  ``t_B x step_C / step_B`` on, the acceptance C must reach to beat B;
- the **headline**: every configuration at its measured simulated tau, the winner per concurrency and its margin
  over the runner-up.

Writes ``acceptance_crossover.json``, ``.md`` and one PNG (a panel per concurrency) beside the run or in ``--out``.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Optional

from bench.side_by_side import simulated_taus
from sglang_ddtree.cli import OneLineArgumentParser

PROJECTED_TAUS = [1 + 0.25 * i for i in range(29)]  # 1 .. 8


class CrossoverError(ValueError):
    """The run cannot answer the question (no simulated acceptance, no greedy cells, no baseline)."""


def measured_steps(report: dict) -> list[dict]:
    """One entry per greedy (configuration, concurrency) cell: its step ms, tau and tok/s; datasets pooled by the
    median of their cells."""
    simulated = report["meta"].get("simulated_tau") or {}
    if not simulated:
        raise CrossoverError("the run has no --simulate-tau: its acceptance is the random weights', not a chosen one")
    cells: dict[tuple[str, int], list[dict]] = {}
    for row in report["summary"]:
        if row["temperature"] == 0 and row["tpot_s"] and row["tau"]:
            cells.setdefault((row["config"], row["concurrency"]), []).append(row)
    if not cells:
        raise CrossoverError("the run has no greedy (T=0) cell with decode steps")
    entries = []
    for (config, concurrency), rows in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0])):
        entries.append({
            "config": config, "concurrency": concurrency,
            "step_ms": statistics.median_high(row["tpot_s"] * row["tau"] * 1000 for row in rows),
            "tau": statistics.median_high(row["tau"] for row in rows),
            "output_tok_s": statistics.median_high(row["output_tok_s"] for row in rows),
            "simulated_tau": simulated.get(config, simulated.get(config.split()[0])),
        })  # fmt: skip
    return entries


def projected_tok_s(entry: dict, tau: float) -> float:
    """Decode tok/s of the cell at acceptance ``tau``, its measured step held (the projection's assumption)."""
    return entry["concurrency"] * tau / entry["step_ms"] * 1000


def tau_to_match(entry: dict, baseline: dict, baseline_tau: float) -> float:
    """The acceptance at which ``entry`` decodes as fast as ``baseline`` does at ``baseline_tau``."""
    return baseline_tau * entry["step_ms"] / baseline["step_ms"]


def crossover(report: dict, headline: dict[str, float]) -> dict:
    """The measured steps, each DDTree configuration's tau to match each headline baseline, and per concurrency
    the ranking at the measured taus (decode tok/s = concurrency x tau / step)."""
    entries = measured_steps(report)
    by_cell = {(e["config"], e["concurrency"]): e for e in entries}
    concurrencies = sorted({e["concurrency"] for e in entries})
    missing = [name for name in headline if not any((name, c) in by_cell for c in concurrencies)]
    if missing:
        raise CrossoverError(f"no greedy cell of the headline baseline(s) {', '.join(missing)} in the run")
    crossings, ranking = [], []
    for concurrency in concurrencies:
        cell = [e for e in entries if e["concurrency"] == concurrency]
        for entry in cell:
            if not entry["config"].startswith("ddtree") or entry["config"] == "ddtree auto":
                continue
            for name, tau in headline.items():
                if (name, concurrency) in by_cell:
                    crossings.append({"config": entry["config"], "concurrency": concurrency, "baseline": name,
                                      "baseline_tau": tau,
                                      "tau_to_match": tau_to_match(entry, by_cell[name, concurrency], tau)})  # fmt: skip
        ranked = sorted(cell, key=lambda e: -projected_tok_s(e, e["tau"]))
        best, second = ranked[0], (ranked[1] if len(ranked) > 1 else None)
        ranking.append({"concurrency": concurrency, "winner": best["config"],
                        "decode_tok_s": projected_tok_s(best, best["tau"]), "runner_up": second and second["config"],
                        "margin": projected_tok_s(best, best["tau"]) / projected_tok_s(second, second["tau"])
                        if second else None})  # fmt: skip
    return {"meta": {k: report["meta"].get(k) for k in ("date", "commit", "gpu", "model_path", "tp", "simulated_tau")},
            "headline_taus": headline, "steps": entries, "crossings": crossings, "ranking": ranking}  # fmt: skip


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        "# Output tok/s against acceptance length (simulated acceptance; the lines are projections)", "",
        f"{meta.get('date')} · commit {meta.get('commit')} · {meta.get('gpu')} · TP {meta.get('tp')} · "
        f"model {meta.get('model_path')} · simulated tau {meta.get('simulated_tau')}", "",
        "Measured per cell (greedy): the decode step (median request's TPOT x tau) at the simulated tau. Decode tok/s "
        "at tau t is projected as concurrency x t / step.", "",
        "| config | concurrency | simulated tau | measured tau | step ms | decode tok/s at measured tau | output tok/s (measured, incl. prefill) |",
        "|:--|--:|--:|--:|--:|--:|--:|",
    ]  # fmt: skip
    for e in result["steps"]:
        lines.append(f"| {e['config']} | {e['concurrency']} | {e['simulated_tau'] or '–'} | {e['tau']:.2f} | "
                     f"{e['step_ms']:.2f} | {projected_tok_s(e, e['tau']):.1f} | {e['output_tok_s']:.1f} |")  # fmt: skip
    if result["crossings"]:
        lines += ["", "Acceptance DDTree needs to decode as fast as each baseline at its headline tau "
                  "(tau_baseline x step_DDTree / step_baseline):", "",
                  "| config | concurrency | baseline | baseline tau | DDTree tau to match |", "|:--|--:|:--|--:|--:|"]
        lines += [f"| {c['config']} | {c['concurrency']} | {c['baseline']} | {c['baseline_tau']:g} | "
                  f"{c['tau_to_match']:.2f} |" for c in result["crossings"]]  # fmt: skip
    lines += ["", "At the measured (simulated) taus, per concurrency:", "",
              "| concurrency | fastest | decode tok/s | runner-up | margin |", "|--:|:--|--:|:--|--:|"]
    lines += [f"| {r['concurrency']} | {r['winner']} | {r['decode_tok_s']:.1f} | {r['runner_up'] or '–'} | "
              + (f"{r['margin']:.2f}x |" if r["margin"] else "– |") for r in result["ranking"]]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    concurrencies = [r["concurrency"] for r in result["ranking"]]
    configs = sorted({e["config"] for e in result["steps"]})
    colors = {config: f"C{i % 10}" for i, config in enumerate(configs)}
    fig, axes = plt.subplots(1, len(concurrencies), figsize=(5 * len(concurrencies), 4), squeeze=False)
    for ax, concurrency in zip(axes[0], concurrencies):
        cell = {e["config"]: e for e in result["steps"] if e["concurrency"] == concurrency}
        for config, entry in cell.items():
            ax.plot([entry["tau"]], [projected_tok_s(entry, entry["tau"])], marker="o", color=colors[config],
                    label=config)  # fmt: skip
            if config not in ("ar", "ddtree auto"):
                ax.plot(PROJECTED_TAUS, [projected_tok_s(entry, t) for t in PROJECTED_TAUS], linestyle="--",
                        color=colors[config])  # fmt: skip
        for name, tau in result["headline_taus"].items():  # a DDTree line crosses it at its tau to match
            if name in cell:
                ax.axhline(projected_tok_s(cell[name], tau), linestyle=":", color=colors[name],
                           label=f"{name} at tau {tau:g}")  # fmt: skip
        ax.set(xlabel="acceptance length (tokens per verify)", ylabel="decode tok/s (projected lines)",
               title=f"concurrency {concurrency}")  # fmt: skip
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> None:
    parser = OneLineArgumentParser(prog="python -m bench.acceptance_crossover", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a bench.side_by_side output folder (side_by_side.json)")
    parser.add_argument("--headline", type=simulated_taus, default={"mtp": 3.556, "dflash": 3.1},
                        help="baseline=tau: the acceptance each baseline reaches on the user's model (default: MTP's "
                             "published Qwen3.6-27B TP=2 tau, the user's DFlash)")  # fmt: skip
    parser.add_argument("--out", help="where to write (default: the run folder)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    source = Path(args.run) / "side_by_side.json"
    if not source.is_file():
        source = source.with_suffix(".json.gz")  # a committed report, compressed to keep the checkout small
    if not source.is_file():
        parser.error(f"{source.with_suffix('')} does not exist: --run names a bench.side_by_side output folder")
    try:
        text = gzip.decompress(source.read_bytes()).decode() if source.suffix == ".gz" else source.read_text()
        result = crossover(json.loads(text), args.headline)
    except CrossoverError as e:
        parser.error(str(e))
    out = Path(args.out or args.run)
    out.mkdir(parents=True, exist_ok=True)
    (out / "acceptance_crossover.json").write_text(json.dumps(result, indent=1))
    (out / "acceptance_crossover.md").write_text(markdown(result))
    plot(result, out / "acceptance_crossover.png")
    print((out / "acceptance_crossover.md").read_text())


if __name__ == "__main__":
    main()
