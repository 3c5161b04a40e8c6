"""Which directories a sandbox may be given: the refusal rules, table-driven."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.local import isolation
from jupyter_sandbox.control_plane.local.isolation import UnsafeMount, python_paths


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for sub in ("home/alice/venv/lib", "home/alice/.local/share/jupyter/sandbox", "opt/py", "srv"):
        (tmp_path / sub).mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(
    ("install", "refused"),
    [
        ("opt/py", None),  # a Python of its own
        ("home/alice/venv", None),  # a virtualenv inside the home directory
        ("home/alice", "contains your home directory"),  # the home itself (prefix ~)
        ("home", "contains your home directory"),
        ("", "contains your home directory"),  # a prefix of /
        ("home/alice/.local/share/jupyter", "overlaps the sandbox daemon's state"),
        ("home/alice/.local/share/jupyter/sandbox", "overlaps the sandbox daemon's state"),
    ],
)
def test_installation_directories_are_refused_when_they_expose_the_user(
    monkeypatch: pytest.MonkeyPatch, tree: Path, install: str, refused: str | None
) -> None:
    prefix = str(tree / install) if install else str(tree)
    monkeypatch.setattr(isolation, "installation_paths", lambda: [prefix])
    monkeypatch.setattr(isolation, "package_dir", lambda: str(tree / "srv"))
    home = str(tree / "home" / "alice")
    state = tree / "home" / "alice" / ".local" / "share" / "jupyter" / "sandbox"
    if refused is None:
        assert os.path.realpath(prefix) in python_paths(state, home=home)
    else:
        with pytest.raises(UnsafeMount, match=refused) as info:
            python_paths(state, home=home)
        assert os.path.realpath(prefix) in str(info.value)


def test_the_working_directory_and_pythonpath_are_not_mounted(
    monkeypatch: pytest.MonkeyPatch, tree: Path
) -> None:
    monkeypatch.chdir(tree / "srv")
    monkeypatch.syspath_prepend(str(tree / "opt"))
    paths = python_paths(tree / "state", home=str(tree / "home" / "alice"))
    assert str(tree / "srv") not in paths and str(tree / "opt") not in paths


def test_nested_paths_collapse_to_the_outermost(
    monkeypatch: pytest.MonkeyPatch, tree: Path
) -> None:
    outer, inner = tree / "opt" / "py", tree / "opt" / "py" / "lib"
    inner.mkdir()
    monkeypatch.setattr(isolation, "installation_paths", lambda: [str(inner), str(outer)])
    monkeypatch.setattr(isolation, "package_dir", lambda: str(inner))
    assert python_paths(None, home=str(tree / "home" / "alice")) == [str(outer)]
