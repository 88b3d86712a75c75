"""``bench.provenance``: a resumed report's timings come from one card."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.provenance import refuse_another_cards_report  # noqa: E402


def test_a_report_from_another_card_is_not_resumed_and_one_from_the_same_card_is(tmp_path):
    """A GPU call asked for an H200 may get an H100: its cells must not join the H200's table."""
    report = tmp_path / "side_by_side.json"
    refuse_another_cards_report(report, "NVIDIA H100 80GB HBM3", "bench.side_by_side")  # nothing to resume yet
    report.write_text(json.dumps({"meta": {"gpu": "NVIDIA H200"}, "requests": []}))
    refuse_another_cards_report(report, "NVIDIA H200", "bench.side_by_side")
    with pytest.raises(SystemExit, match="measured on NVIDIA H200, this is NVIDIA H100 80GB HBM3; start a new folder"):
        refuse_another_cards_report(report, "NVIDIA H100 80GB HBM3", "bench.side_by_side")
