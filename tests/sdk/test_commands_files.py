"""Commands, streaming and files on one shared sandbox."""

from __future__ import annotations

import os
import time

import pytest

from jupyter_sandbox.client import (
    ExecutionResult,
    Sandbox,
    SandboxPathError,
    SandboxRequestError,
)


def test_run_exit_codes_and_stderr(sandbox: Sandbox) -> None:
    ok = sandbox.commands.run("echo hi there")
    assert ok == ExecutionResult("hi there\n", "", 0) and ok.ok
    failed = sandbox.commands.run("sh -c 'echo oops >&2; exit 7'")
    assert (failed.exit_code, failed.stderr, failed.ok) == (7, "oops\n", False)
    missing = sandbox.commands.run("no-such-command-xyz")
    assert missing.exit_code == 127
    # Without shell=True the command is split with shlex and run as is, like upstream.
    assert sandbox.commands.run("echo a | cat").stdout == "a | cat\n"
    assert sandbox.commands.run("echo a | tr a b", shell=True).stdout == "b\n"


def test_run_timeout_kills_the_command(sandbox: Sandbox) -> None:
    start = time.monotonic()
    result = sandbox.commands.run("sh -c 'echo started; sleep 60'", timeout=1)
    assert time.monotonic() - start < 15
    assert result.exit_code == 124
    # Output printed before the timeout is not kept by the runtime's /execute
    # (use commands.stream for that; see test_stream_timeout_and_result).
    assert "timed out" in result.stderr


def test_stream_delivers_output_as_it_comes(sandbox: Sandbox) -> None:
    command = "sh -c 'for i in 1 2 3; do echo out$i; sleep 0.4; done; echo bad >&2; exit 3'"
    stream = sandbox.commands.stream(command, timeout=60)
    arrivals = []
    for chunk in stream:
        arrivals.append((time.monotonic(), chunk.stream, chunk.text))
    assert stream.exit_code == 3
    assert "".join(t for _, s, t in arrivals if s == "stdout") == "out1\nout2\nout3\n"
    assert stream.stderr == "bad\n"
    # Chunks arrived while the command ran, not all at the end.
    assert arrivals[-1][0] - arrivals[0][0] > 0.6


def test_stream_timeout_and_result(sandbox: Sandbox) -> None:
    result = sandbox.commands.stream("sh -c 'echo x; sleep 60'", timeout=1).result()
    assert result.exit_code == 124 and result.stdout == "x\n"


def test_leaving_a_stream_early_stops_the_command(sandbox: Sandbox) -> None:
    sandbox.commands.run("rm -f after-break")
    stream = sandbox.commands.stream("sh -c 'echo first; sleep 2; touch after-break'", timeout=60)
    for chunk in stream:
        assert chunk.text == "first\n"
        break
    time.sleep(3)
    assert not sandbox.files.exists("after-break")


def test_files_round_trip(sandbox: Sandbox) -> None:
    binary = bytes(range(256)) * 64 + os.urandom(300_000)
    sandbox.files.write("deep/nested dir/data.bin", binary)
    assert sandbox.files.read("deep/nested dir/data.bin") == binary
    sandbox.files.write("deep/unicode-é.txt", "héllo wörld ✓")
    assert sandbox.files.read("deep/unicode-é.txt").decode() == "héllo wörld ✓"
    sandbox.files.write("/deep/./abs.txt", "leading slash is workspace-relative")
    assert sandbox.files.read("deep/abs.txt") == b"leading slash is workspace-relative"

    entries = {e.name: e for e in sandbox.files.list("deep")}
    assert set(entries) == {"nested dir", "unicode-é.txt", "abs.txt"}
    assert entries["nested dir"].type == "directory"
    assert entries["abs.txt"].type == "file" and entries["abs.txt"].size == 35
    assert entries["abs.txt"].modified.tzinfo is not None
    assert "deep" in {e.name for e in sandbox.files.list(".")}
    assert sandbox.files.exists("deep/nested dir/data.bin")
    assert sandbox.files.exists("deep")
    assert not sandbox.files.exists("deep/missing.txt")
    # What commands see is the same workspace.
    assert sandbox.commands.run("cat deep/abs.txt").stdout.startswith("leading slash")

    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.read("deep/missing.txt")
    assert info.value.status_code == 404
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.list("deep/abs.txt")
    assert info.value.status_code == 404


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/..", "x\x00y", ""])
def test_path_traversal_is_refused_by_the_client(sandbox: Sandbox, path: str) -> None:
    with pytest.raises(SandboxPathError):
        sandbox.files.write(path, "no")
    with pytest.raises(SandboxPathError):
        sandbox.files.read(path)


def test_path_traversal_is_refused_by_the_runtime(sandbox: Sandbox) -> None:
    """With the client's check off, the runtime still confines, symlinks included."""
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.write("../escape.txt", "no", allow_unsafe_paths=True)
    assert info.value.status_code == 403
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.read("../../etc/hostname", allow_unsafe_paths=True)
    assert info.value.status_code == 403
    sandbox.commands.run("ln -sfn / rootlink")
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.read("rootlink/etc/hostname")
    assert info.value.status_code == 403
    with pytest.raises(SandboxRequestError) as info:
        sandbox.files.write("rootlink/tmp/escape.txt", "no")
    assert info.value.status_code == 403
