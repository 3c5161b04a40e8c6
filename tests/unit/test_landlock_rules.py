"""The Landlock rules that keep a bound directory to data (runtime/landlock.py):
which hierarchies are granted special files, computed from a directory tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_sandbox.runtime import landlock

SPECIAL = landlock.SPECIAL_FILES | landlock.REFER


def test_every_sibling_along_the_path_keeps_special_files_and_the_bound_tree_does_not(
    tmp_path: Path,
) -> None:
    for d in ("home/alice/project/sub", "home/bob", "tmp", "workspace"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "home" / "alice" / "notes.txt").write_text("a file, not a hierarchy")
    (tmp_path / "home" / "alice" / "link").symlink_to(tmp_path / "tmp")
    rules = landlock.bound_tree_carries_data(str(tmp_path / "home/alice/project"), str(tmp_path))
    grants = {str(Path(p).relative_to(tmp_path)): rights for p, rights in rules.grants}
    assert grants == {
        "tmp": SPECIAL,
        "workspace": SPECIAL,
        "home/bob": SPECIAL,
        "home/alice/project": landlock.REFER,  # renames and links within it only
    }
    assert rules.handled == SPECIAL


def test_this_kernel_reports_its_landlock_abi() -> None:
    assert landlock.abi_version() >= 0


def test_without_bubblewrap_or_landlock_nothing_confines_and_the_hint_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_sandbox.control_plane.local import isolation

    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    found = isolation._landlock_only("bubblewrap (bwrap) is not installed")
    assert (found.kind, found.confined) == ("none", False)
    assert "apt install bubblewrap" in found.detail
    monkeypatch.setattr(landlock, "abi_version", lambda: 6)
    found = isolation._landlock_only("bubblewrap (bwrap) is not installed")
    assert (found.kind, found.confined, found.isolated) == ("landlock", True, False)
    assert "ports 53, 80, 443" in found.detail and "no signals" in found.detail


def test_a_process_without_its_own_pid_namespace_is_given_no_process_directory() -> None:
    """Landlock does not keep a confined process from reading /proc/<pid>/environ of
    the user's other processes, so /proc itself is never granted, only its
    machine-wide files."""
    from jupyter_sandbox.control_plane.local.isolation import PROC_GLOBAL, landlock_rules

    rules = landlock_rules(workspace="/nonexistent-ws", runtime_dir="/nonexistent-run")
    granted = [path for path, _ in rules.grants]
    assert "/proc" not in granted and "/proc/self" not in granted
    assert set(PROC_GLOBAL) & set(granted)
