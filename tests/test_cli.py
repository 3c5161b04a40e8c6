"""The jupyter-sandbox command line, as users and the deploy/ manifests call it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv,expect",
    [
        # deploy/operator: `jupyter-sandbox operator --leader-elect ...`
        (["operator", "--leader-elect", "--help"], "--leader-election-namespace"),
        # deploy/router: `jupyter-sandbox router --resolve=api --port=8080`
        (["router", "--resolve=dns", "--port=8080", "--help"], "--allowed-namespaces"),
        (["runtime", "--port", "8888", "--help"], "--unix-socket"),
    ],
)
def test_program_subcommands_take_their_own_options(argv: list[str], expect: str) -> None:
    result = cli(*argv)
    assert result.returncode == 0, result.stderr
    assert expect in result.stdout


def test_bad_input_is_a_clear_error() -> None:
    result = cli("install-kernelspec", "--pool", "Not A Pool")
    assert result.returncode == 2
    assert "error: pool name 'Not A Pool' is not valid" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("frobnicate")
    assert result.returncode == 2 and "invalid choice" in result.stderr
