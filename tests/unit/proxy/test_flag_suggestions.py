"""A mistyped flag, on every subcommand of `fleet-proxy` (and of `fleet-proxy bench`), is
refused under that subcommand's usage with the flag it most likely meant; and the scan that
finds unknown flags reads a command line as argparse does."""

from __future__ import annotations

import pytest

from bench.cli import SUBCOMMANDS as BENCH_SUBCOMMANDS
from proxy.serving.cli import SUBCOMMANDS, main, subcommand_parser
from proxy.serving.flag_suggestions import unknown_flags

EVERY_SUBCOMMAND = [[name] for name in SUBCOMMANDS] + [
    ["bench", name] for name in BENCH_SUBCOMMANDS
]


def mistyped(flag: str) -> str:
    """`flag` with its first letter doubled (`--port` -> `--pport`): no prefix of any flag,
    so argparse cannot take it for an abbreviation."""
    return flag[:3] + flag[2:]


@pytest.mark.parametrize("command", EVERY_SUBCOMMAND, ids=" ".join)
def test_every_subcommand_names_the_flag_a_typo_meant_under_its_own_usage(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [
        s
        for action in subcommand_parser(command)._actions
        for s in action.option_strings
        if s.startswith("--") and s not in {"--help", "--version"}
    ]
    # The first flag is the required one where a subcommand has one (--proxy, --target,
    # --isl): its typo must be named, not reported as the flag missing.
    flag = flags[0]
    typo = mistyped(flag)
    with pytest.raises(SystemExit) as done:
        main([*command, typo, "1"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    prog = "fleet-proxy " + " ".join(command)
    assert err.startswith(f"usage: {prog} "), err
    assert err.strip().splitlines()[-1] == (
        f"{prog}: error: unrecognized arguments: {typo} 1 ({typo}: did you mean {flag}?)"
    )


def test_the_walk_covers_every_subcommand_listed_in_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out.split("{", 1)[1].split("}", 1)[0].split(",")
    assert listed == [c[0] for c in EVERY_SUBCOMMAND if len(c) == 1]


def test_a_typo_beside_a_missing_required_flag_is_the_one_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["reschedule", "--proxi", "http://127.0.0.1:8000"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("(--proxi: did you mean --proxy?)"), last
    assert "required" not in last


KNOWN = ["--port", "--policy", "--speed", "-n", "--help", "-h"]


@pytest.mark.parametrize(
    ("argv", "unknown"),
    [
        (["--port", "8000"], []),
        (["--port=8000", "--prot", "8000", "--speed", "2"], ["--prot", "8000"]),
        (["--prot=8000"], ["--prot=8000"]),
        # A prefix of one flag is argparse's abbreviation, of two its ambiguity: not unknown.
        (["--sp", "2", "--po", "x"], []),
        # Negative numbers, a lone dash and words with spaces are values.
        (["--speed", "-1", "--port", "-", "--policy", "-a b"], []),
        # A short flag with its value attached.
        (["-n5"], []),
        (["-x"], ["-x"]),
        # After `--` every word is a value.
        (["--", "--prot"], []),
    ],
)
def test_unknown_flags_are_the_words_argparse_would_refuse(
    argv: list[str], unknown: list[str]
) -> None:
    assert unknown_flags(argv, KNOWN) == unknown


def test_without_abbreviations_a_prefix_is_unknown() -> None:
    assert unknown_flags(["--sp", "2"], KNOWN, allow_abbrev=False) == ["--sp", "2"]
