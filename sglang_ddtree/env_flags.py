"""The plugin's on/off environment switches (``SGLANG_DDTREE_*``): one spelling of "on" for all of them."""

from __future__ import annotations

import os

_OFF = ("0", "false", "False")


def env_flag(name: str, default: bool = False) -> bool:
    """``name``'s switch: ``default`` when unset or empty, off for ``0`` / ``false``, else on."""
    value = os.environ.get(name, "")
    if value == "":
        return default
    return value not in _OFF
