"""Copy mode's pure rules: which names travel, what is collected, where conflicts go."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_sandbox.kernel_provisioner.file_sync import (
    Limits,
    SyncReport,
    collect,
    conflict_name,
    valid_component,
)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("data.csv", True),
        ("Résumé 2026.txt", True),
        ("", False),
        (".", False),
        ("..", False),
        (".git", False),
        (".bashrc", False),
        (".ipynb_checkpoints", False),
        ("a/b", False),
        ("a\\b", False),
        ("nul\x00byte", False),
        ("__pycache__", False),
        ("node_modules", False),
        ("module.pyc", False),
        ("conftest.py", False),
        ("HEAD", False),
        ("evil.pth", False),
        ("sitecustomize.py", False),
    ],
)
def test_which_names_travel(name: str, ok: bool) -> None:
    assert valid_component(name) is ok


def tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.csv").write_text("12345")
    (root / "sub" / "b.txt").write_text("123")
    (root / "sub" / "deeper" / "c.txt").write_text("1")
    (root / ".hidden").write_text("secret")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_text("x")
    (root / "big.bin").write_bytes(b"x" * 100)
    (root / "link").symlink_to(root / "a.csv")
    os.mkfifo(root / "fifo")
    return root


def test_collect_takes_visible_regular_files_only(tmp_path: Path) -> None:
    files, skipped = collect(str(tree(tmp_path)), Limits())
    assert files == [("a.csv", 5), ("big.bin", 100), ("sub/b.txt", 3), ("sub/deeper/c.txt", 1)]
    assert skipped == [("link", "a symlink")]


@pytest.mark.parametrize(
    ("limits", "taken", "why"),
    [
        (Limits(max_file_bytes=50), ["a.csv", "sub/b.txt", "sub/deeper/c.txt"], "larger than"),
        (Limits(max_files=2), ["a.csv", "big.bin"], "over 2 files"),
        (Limits(max_total_bytes=106), ["a.csv", "big.bin", "sub/deeper/c.txt"], "in all"),
    ],
)
def test_collect_stays_within_its_bounds(
    tmp_path: Path, limits: Limits, taken: list[str], why: str
) -> None:
    files, skipped = collect(str(tree(tmp_path)), limits)
    assert [rel for rel, _ in files] == taken
    assert any(why in reason for _, reason in skipped), skipped


@pytest.mark.parametrize(
    ("rel", "existing", "expected"),
    [
        ("data.csv", set(), "data.from-sandbox.csv"),
        ("sub/data.csv", set(), "sub/data.from-sandbox.csv"),
        ("Makefile", set(), "Makefile.from-sandbox"),
        ("a.tar.gz", set(), "a.tar.from-sandbox.gz"),
        ("data.csv", {"data.from-sandbox.csv"}, "data.from-sandbox-2.csv"),
    ],
)
def test_conflict_names_keep_the_extension(rel: str, existing: set[str], expected: str) -> None:
    assert conflict_name(rel, lambda candidate: candidate in existing) == expected


def test_the_summary_says_what_happened() -> None:
    report = SyncReport("back", copied=["a", "b"], bytes=2_500_000)
    report.conflicts.append(("data.csv", "data.from-sandbox.csv"))
    report.skipped.append(("link", "a symlink"))
    text = report.summary()
    assert text.startswith("2 file(s) copied back (2.5 MB)")
    assert "data.csv -> data.from-sandbox.csv" in text
    assert "link (a symlink)" in text


@pytest.mark.parametrize(
    ("backend", "files", "config", "error"),
    [
        ("local", "auto", None, ""),
        ("local", "copy", "copy", ""),
        ("kubernetes", "none", "none", ""),
        ("kubernetes", "bind", None, "needs the local backend"),
        ("local", "rsync", None, "files must be one of"),
    ],
)
def test_a_kernelspec_says_how_its_kernels_see_the_files(
    backend: str, files: str, config: str | None, error: str
) -> None:
    from jupyter_sandbox.kernelspec import make_kernelspec

    if error:
        with pytest.raises(ValueError, match=error):
            make_kernelspec("p", backend=backend, files=files)
        return
    spec = make_kernelspec("p", backend=backend, files=files)
    assert spec["metadata"]["kernel_provisioner"]["config"].get("files") == config
    # Told apart in the launcher from the pool's other kernelspecs.
    assert spec["display_name"].endswith("p)" if files == "auto" else f"files: {files})")
