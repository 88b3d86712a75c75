"""The GPU suites' servers ask SGLang for an amount of memory, not a share set on one card: SGLang sizes a server from
``total x --mem-fraction-static`` less what its neighbours already hold, so the H200's 0.08 left an 80 GB H100's
servers no KV cache (tests/gpu/RESULTS.md run 72). ``suite_servers.mem_fraction_flags`` reads the card's total from
``nvidia-smi``; here a stand-in prints it."""

import importlib.util
import os

import pytest

SUITE_SERVERS = os.path.join(os.path.dirname(__file__), "gpu", "suite_servers.py")


@pytest.fixture
def card_with(tmp_path, monkeypatch):
    """``card_with(mib)``: ``suite_servers`` on a machine whose ``nvidia-smi`` reports ``mib`` MiB for GPU 0."""
    spec = importlib.util.spec_from_file_location("suite_servers", SUITE_SERVERS)
    suite_servers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite_servers)

    def card(mib: int):
        smi = tmp_path / "nvidia-smi"
        asked = "-i 0 --query-gpu=memory.total --format=csv,noheader,nounits"
        smi.write_text(f'#!/bin/sh\n[ "$*" = "{asked}" ] && echo {mib}\n')
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        return suite_servers

    return card


def test_the_h200_keeps_its_share_and_an_80_gb_card_gets_the_same_amount(card_with):
    assert card_with(143_771).mem_fraction_flags(0.08) == ["--mem-fraction-static", "0.0800"]
    assert card_with(81_559).mem_fraction_flags(0.08) == ["--mem-fraction-static", "0.1410"]  # H100 80 GB HBM3
    assert card_with(81_559).mem_fraction_flags(0.06) == ["--mem-fraction-static", "0.1058"]


def test_a_small_card_is_capped_at_nine_tenths(card_with):
    assert card_with(8_192).mem_fraction_flags(0.08) == ["--mem-fraction-static", "0.9000"]
