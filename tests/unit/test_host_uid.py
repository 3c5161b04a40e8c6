"""The host uid setting for a root daemon's sandboxes (host_uid.py)."""

from __future__ import annotations

import pytest

from jupyter_sandbox.control_plane.local import host_uid


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", host_uid.DEFAULT_HOST_UID), ("3000000000", 3_000_000_000), ("65536", 65536)],
)
def test_the_host_uid_is_the_default_or_the_setting(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: int
) -> None:
    monkeypatch.setenv(host_uid.HOST_UID_ENV, raw)
    assert host_uid.host_uid_setting() == expected


@pytest.mark.parametrize("raw", ["0", "-5", "root", "4294967295", "1e9"])
def test_a_host_uid_that_is_root_or_no_uid_is_refused(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(host_uid.HOST_UID_ENV, raw)
    with pytest.raises(ValueError, match=host_uid.HOST_UID_ENV):
        host_uid.host_uid_setting()


def test_the_runtime_becomes_the_sandbox_user_before_anything_else() -> None:
    code = host_uid.become_sandbox_user_code()
    assert code.startswith("import os; os.setgroups([]); os.setresgid(1000")
    assert code.index("setresgid") < code.index("setresuid") < code.index("chdir")
