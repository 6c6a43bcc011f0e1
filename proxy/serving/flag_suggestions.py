"""A mistyped flag answered with the closest flags its command has, under that command's usage."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence
from typing import Any


def unrecognized(extras: Sequence[str], known: Iterable[str]) -> str:
    """argparse's "unrecognized arguments" message, with the closest known flag for each
    unknown one (`--prot 8000` -> `did you mean --port?`)."""
    flags = sorted(set(known))
    hints = []
    for word in extras:
        if not word.startswith("-"):
            continue
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    message = "unrecognized arguments: " + " ".join(extras)
    return message + (" (" + "; ".join(hints) + ")" if hints else "")


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings]


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose unknown flags come with the closest flags it has."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(extras, option_strings(self)))
        return parsed
