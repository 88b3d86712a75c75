"""Merge side-by-side runs that split one sweep by dataset (e.g. one dataset per GPU of a host) into one report.

    python -m bench.merge_side_by_side --out DIR PART_DIR PART_DIR ...

Every speedup and greedy comparison is made inside one dataset's cells, so parts that measured disjoint
datasets give the same report as one run would, each ratio still measured side by side on one GPU. Parts
that share a dataset are refused: their cells would mix two runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from bench.side_by_side import resumed, write_report
from sglang_ddtree.cli import OneLineArgumentParser


class MergeError(ValueError):
    """Parts that cannot form one report; printed as one line."""


def merge(parts: list[Path], out: Path) -> dict:
    """Write the merged ``side_by_side.json`` / ``.md`` / plots into ``out``; the meta is the first part's,
    with ``parts`` listing each part's folder, commit, GPU and datasets."""
    records, ar_top2, commands, step_profiles, part_metas = [], {}, {}, [], []
    owner: dict[str, Path] = {}
    first_meta = None
    for part in parts:
        path = part / "side_by_side.json"
        if not path.is_file():
            raise MergeError(f"'{part}' has no side_by_side.json")
        meta = json.loads(path.read_text())["meta"]
        first_meta = first_meta or meta
        part_records, part_top2, part_commands, part_profiles = resumed(part)
        datasets = sorted({r.dataset for r in part_records})
        for dataset in datasets:
            if dataset in owner:
                raise MergeError(f"'{owner[dataset]}' and '{part}' both measured {dataset}: parts must split by dataset")
            owner[dataset] = part
        records += part_records
        ar_top2.update(part_top2)
        commands.update(part_commands)
        step_profiles += part_profiles
        part_metas.append({"dir": str(part), "commit": meta.get("commit"), "gpu": meta.get("gpu"), "datasets": datasets})
    return write_report(out, {**first_meta, "commands": commands, "parts": part_metas}, records, ar_top2, step_profiles)


def main(argv: Optional[list[str]] = None) -> None:
    parser = OneLineArgumentParser(prog="python -m bench.merge_side_by_side", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("parts", nargs="+", help="side-by-side output folders")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        merge([Path(p) for p in args.parts], Path(args.out))
    except MergeError as e:
        print(f"python -m bench.merge_side_by_side: error: {e}", file=sys.stderr)
        sys.exit(2)
    print((Path(args.out) / "side_by_side.md").read_text())


if __name__ == "__main__":
    main()
