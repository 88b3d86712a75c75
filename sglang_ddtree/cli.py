"""Command-line conventions shared by the package's tools."""

from __future__ import annotations

import argparse
import sys


class OneLineArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are one ``PROG: error: MESSAGE`` line and exit code 2 (no usage dump)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers, e.g. ``16,32,64``."""
    try:
        return [int(item) for item in text.split(",") if item]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None


def float_list(text: str) -> list[float]:
    """argparse type: comma-separated numbers, e.g. ``1,0.5,0.25``."""
    try:
        return [float(item) for item in text.split(",") if item]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of numbers") from None
