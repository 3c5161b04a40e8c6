"""Claim, use, terminate; the context manager releases; bad requests fail clearly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jupyter_sandbox.client import (
    SandboxClient,
    SandboxError,
    SandboxInvalidRequestError,
    SandboxNotFoundError,
    SandboxWarmPoolNotFoundError,
)

from .conftest import claim_names, local_claims


def test_create_use_terminate(warm_daemon: Path) -> None:
    client = SandboxClient()
    try:
        sb = client.create_sandbox(warmpool="default", labels={"purpose": "sdk-test"})
        assert sb.claim_name and sb.claim_name.startswith("sandbox-claim-")
        assert sb.sandbox_id
        assert client.list_active_sandboxes() == [("default", sb.claim_name)]
        [claim] = [c for c in local_claims(warm_daemon) if c.name == sb.claim_name]
        assert claim.labels["purpose"] == "sdk-test"
        assert claim.labels["jupyter-sandbox/user"]  # the SDK labels claims with their user
        assert sb.status()[0] == "SandboxReady"
        assert sb.commands.run("echo hello").stdout == "hello\n"

        name = sb.claim_name
        sb.terminate()
        assert name not in claim_names(warm_daemon)
        assert sb.claim_name is None and not sb.is_active
        assert client.list_active_sandboxes() == []
        sb.terminate()  # idempotent
        with pytest.raises(SandboxError, match="closed"):
            sb.commands.run("true")
    finally:
        client.close()


def test_context_manager_releases_on_exception(warm_daemon: Path) -> None:
    client = SandboxClient()
    names = []
    with pytest.raises(ZeroDivisionError):
        with client.create_sandbox(warmpool="default") as sb:
            names.append(sb.claim_name)
            assert names[0] in claim_names(warm_daemon)
            sb.files.write("x.txt", "x")
            1 / 0  # noqa: B018
    assert names[0] not in claim_names(warm_daemon)
    client.close()


def test_client_context_manager_deletes_all(warm_daemon: Path) -> None:
    names = []
    with pytest.raises(RuntimeError, match="boom"):
        with SandboxClient() as client:
            names.append(client.create_sandbox(warmpool="default").claim_name)
            names.append(client.create_sandbox(warmpool="nonet").claim_name)
            raise RuntimeError("boom")
    assert not set(names) & claim_names(warm_daemon)


def test_get_and_list_from_another_client(warm_daemon: Path) -> None:
    with SandboxClient() as first:
        sb = first.create_sandbox(warmpool="default", labels={"suite": "reattach"})
        sb.files.write("note.txt", b"kept")
        other = SandboxClient()
        try:
            assert sb.claim_name in other.list_all_sandboxes(label_selector="suite=reattach")
            assert other.list_all_sandboxes(label_selector="suite=nothing") == []
            again = other.get_sandbox(sb.claim_name)
            assert again.sandbox_id == sb.sandbox_id
            assert again.files.read("note.txt") == b"kept"
            with pytest.raises(SandboxNotFoundError):
                other.get_sandbox("sandbox-claim-doesnotexist")
            with pytest.raises(SandboxInvalidRequestError):
                other.list_all_sandboxes(label_selector="suite!=x")
        finally:
            other.close()  # closes connections only: the claim stays
        assert sb.claim_name in claim_names(warm_daemon)
    assert sb.claim_name is None


def test_unknown_pool_is_a_clear_error(warm_daemon: Path) -> None:
    before = claim_names(warm_daemon)
    with SandboxClient() as client:
        with pytest.raises(SandboxWarmPoolNotFoundError) as info:
            client.create_sandbox(warmpool="no-such-pool")
        assert "no-such-pool" in str(info.value)
        assert info.value.reason == "PoolNotFound"
        assert "pool create" in info.value.hint
        with pytest.raises(ValueError):
            client.create_sandbox(warmpool="")
        with pytest.raises(SandboxInvalidRequestError, match="shutdown_after_seconds"):
            client.create_sandbox(warmpool="default", shutdown_after_seconds=60)
        with pytest.raises(SandboxInvalidRequestError):
            client.create_sandbox(warmpool="default", labels={"bad key!": "x"})
        assert client.list_active_sandboxes() == []
    assert claim_names(warm_daemon) == before  # nothing leaked by the failures


def test_cleanup_releases_claims_of_a_killed_process(warm_daemon: Path) -> None:
    """cleanup=True ties claims to the process: a SIGKILLed script leaks nothing."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from jupyter_sandbox.client import SandboxClient
        sb = SandboxClient(cleanup=True).create_sandbox(warmpool="default")
        print(sb.claim_name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=os.environ
    )
    name = proc.stdout.strip()
    assert name.startswith("sandbox-claim-"), proc.stderr
    deadline = time.monotonic() + 30  # the tests' orphan grace is 1 s
    while name in claim_names(warm_daemon):
        assert time.monotonic() < deadline, "the orphaned claim was not released"
        time.sleep(0.5)
