"""A mistyped flag answered with the closest flags its command has, under that command's usage.

Unknown flags are looked for before the parser runs: argparse reports a missing required flag
first, so `--proxi URL` would otherwise be answered "--proxy is required" and never name the
typo."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence

# What argparse takes for a value although it starts with a dash: a negative number.
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def unrecognized(extras: Sequence[str], known: Iterable[str]) -> str:
    """argparse's "unrecognized arguments" message, with the closest known flag for each
    unknown one (`--prot 8000` -> `did you mean --port?`)."""
    import difflib  # only when there is something to suggest

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


def _is_flag(word: str) -> bool:
    """Whether argparse reads `word` as a flag rather than a value."""
    return (
        word.startswith("-")
        and word != "-"
        and " " not in word
        and _NEGATIVE_NUMBER.fullmatch(word) is None
    )


def _known(word: str, known: Sequence[str], allow_abbrev: bool) -> bool:
    name = word.split("=", 1)[0]
    if name in known:
        return True
    if name.startswith("--"):
        # A prefix of a flag: argparse completes it, or says which flags it could be.
        return allow_abbrev and any(k.startswith(name) for k in known)
    # A short flag with its value attached (`-n5`), or short flags run together.
    return word[:2] in known


def unknown_flags(
    argv: Sequence[str], known: Sequence[str], allow_abbrev: bool = True
) -> list[str]:
    """The words of `argv` that argparse would refuse as unknown flags, each followed by the
    values after it (as argparse lists them: `--prot 8000`); after `--` every word is a value."""
    out: list[str] = []
    unknown = False
    for word in argv:
        if word == "--":
            break
        if _is_flag(word):
            unknown = not _known(word, known, allow_abbrev)
        if unknown:
            out.append(word)
    return out


def refuse_unknown_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Exit 2 under the parser's usage when `argv` has a flag it does not know, naming the
    closest ones it has; return when every flag is known."""
    known = option_strings(parser)
    extras = unknown_flags(argv, known, parser.allow_abbrev)
    if extras:
        # ArgumentParser.error's own output, whatever a subclass makes of error().
        parser.print_usage(sys.stderr)
        parser.exit(2, f"{parser.prog}: error: {unrecognized(extras, known)}\n")
