"""The Landlock rules that keep a bound directory to data (runtime/landlock.py):
which hierarchies are granted special files, computed from a directory tree."""

from __future__ import annotations

from pathlib import Path

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
