"""The plugin's on/off switches read the environment one way: unset or empty is the switch's default, ``0`` and
``false`` are off, anything else is on (``sglang_ddtree.env_flags``)."""

import pytest

from sglang_ddtree.env_flags import env_flag

NAME = "SGLANG_DDTREE_TEST_SWITCH"


@pytest.mark.parametrize("value", [None, ""])
@pytest.mark.parametrize("default", [False, True])
def test_an_unset_or_empty_switch_keeps_its_default(monkeypatch, value, default):
    if value is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, value)
    assert env_flag(NAME, default=default) is default


@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("False", False), ("1", True), ("yes", True)])
@pytest.mark.parametrize("default", [False, True])
def test_a_set_switch_is_off_only_for_zero_or_false(monkeypatch, value, on, default):
    monkeypatch.setenv(NAME, value)
    assert env_flag(NAME, default=default) is on
