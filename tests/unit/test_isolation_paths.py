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


@pytest.mark.parametrize(
    ("notebooks", "refused"),
    [
        ("home/alice/projects/demo", None),  # a project directory
        ("srv", None),  # outside the home
        ("home/alice", "it is your home directory"),
        ("home", "it contains your home directory"),
        ("", "it contains your home directory"),  # a parent of the home
        ("home/alice/.local/share/jupyter", "overlaps the sandbox daemon's state"),
        ("home/alice/.local/share/jupyter/sandbox/workspaces", "overlaps the sandbox daemon's"),
        ("opt/py/lib", "inside the Python installation"),
        ("home/alice/nowhere", "does not exist"),
    ],
)
def test_notebook_directories_are_refused_when_they_expose_the_user(
    monkeypatch: pytest.MonkeyPatch, tree: Path, notebooks: str, refused: str | None
) -> None:
    (tree / "home/alice/projects/demo").mkdir(parents=True)
    (tree / "home/alice/.local/share/jupyter/sandbox/workspaces").mkdir()
    (tree / "opt/py/lib").mkdir()
    monkeypatch.setattr(isolation, "installation_paths", lambda: [str(tree / "opt/py")])
    home = str(tree / "home" / "alice")
    state = tree / "home" / "alice" / ".local" / "share" / "jupyter" / "sandbox"
    path = str(tree / notebooks) if notebooks else str(tree)
    if refused is None:
        assert isolation.check_files_dir(path, state, home) == os.path.realpath(path)
    else:
        with pytest.raises(UnsafeMount, match=refused):
            isolation.check_files_dir(path, state, home)


@pytest.mark.parametrize("path", ["relative/dir", "", None, 7, "/", "/usr/share"])
def test_notebook_directories_that_are_no_place_for_a_sandbox(path: object) -> None:
    with pytest.raises(UnsafeMount):
        isolation.check_files_dir(path)


def test_a_symlink_to_the_home_directory_is_refused_as_the_home(tree: Path) -> None:
    home = tree / "home" / "alice"
    (tree / "srv" / "link").symlink_to(home)
    with pytest.raises(UnsafeMount, match="your home directory"):
        isolation.check_files_dir(str(tree / "srv" / "link"), None, str(home))


def test_the_notebook_directory_is_bound_under_the_installation_and_git_stays_read_only(
    tmp_path: Path,
) -> None:
    (tmp_path / ".git").mkdir()
    args = isolation.bwrap_command(
        workspace="/ws",
        inner=["true"],
        env={},
        confinement=isolation.Confinement(files_dir=str(tmp_path)),
    )
    bind = args.index("--bind", 0)
    assert args[bind : bind + 3] == ["--bind", str(tmp_path), str(tmp_path)]
    git = str(tmp_path / ".git")
    assert args[args.index(git) - 1] == "--ro-bind"
    first_install = min(args.index(p) for p in isolation.python_paths())
    assert bind < first_install, "the installation is bound on top of the notebook directory"
    read_only = isolation.bwrap_command(
        workspace="/ws",
        inner=["true"],
        env={},
        confinement=isolation.Confinement(files_dir=str(tmp_path), files_read_only=True),
    )
    assert ["--ro-bind", str(tmp_path), str(tmp_path)] == read_only[
        read_only.index(str(tmp_path)) - 1 : read_only.index(str(tmp_path)) + 2
    ]


def test_the_daemon_makes_workspace_directories_through_no_link(tmp_path: Path) -> None:
    """A sandbox planted .local -> ~/.ssh; the daemon's mkdir(parents=True) at the
    next start created ~/.ssh/packages on the host."""
    from jupyter_sandbox.control_plane.local.paths import make_dirs_inside

    workspace, home_ssh = tmp_path / "workspace", tmp_path / "home" / ".ssh"
    workspace.mkdir()
    home_ssh.mkdir(parents=True)
    (workspace / ".local").symlink_to(home_ssh)
    assert make_dirs_inside(workspace, ".local/packages") is False
    assert list(home_ssh.iterdir()) == []
    (workspace / ".local").unlink()
    (workspace / ".local").write_text("a file")
    assert make_dirs_inside(workspace, ".local/packages") is False
    (workspace / ".local").unlink()
    assert make_dirs_inside(workspace, ".local/packages") is True
    assert (workspace / ".local" / "packages").is_dir()
    assert make_dirs_inside(workspace, ".local/packages") is True  # idempotent


@pytest.mark.parametrize(
    ("path", "made", "expected"),
    [
        ("/root/.pyenv/versions/3.11", set(), ["/root", "/root/.pyenv", "/root/.pyenv/versions"]),
        ("/root/.pyenv/versions/3.11", {"/root"}, ["/root/.pyenv", "/root/.pyenv/versions"]),
        ("/etc/resolv.conf", set(), ["/etc"]),
        ("/etc/hosts", {"/etc"}, []),
        ("/opt", set(), []),
    ],
)
def test_ancestors_of_a_bind_are_made_passable_once(
    path: str, made: set[str], expected: list[str]
) -> None:
    args = isolation._parents(path, made)
    assert args == [arg for a in expected for arg in ("--perms", "0755", "--dir", a)]
    assert set(expected) <= made


def test_a_root_daemons_sandbox_enters_the_daemons_namespace_and_keeps_only_setuid() -> None:
    """host_uid.py: bubblewrap joins the prepared namespace (uid 0 there is root, to
    reach root-only sources); the runtime drops to the sandbox user itself."""
    own = isolation.bwrap_command(workspace="/ws", inner=["true"], env={})
    assert "--unshare-user" in own and "--disable-userns" in own and "--userns" not in own
    assert own[own.index("--chdir") + 1] == isolation.WORKSPACE
    shared = isolation.bwrap_command(
        workspace="/ws",
        inner=["true"],
        env={},
        confinement=isolation.Confinement(userns_fd=7),
    )
    assert shared[shared.index("--userns") + 1] == "7"
    assert "--unshare-user" not in shared and "--uid" not in shared
    caps = shared[shared.index("--cap-drop") :][:6]
    assert caps == ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    assert shared[shared.index("--chdir") + 1] == "/"
    assert shared[shared.index("/run") - 3 : shared.index("/run")] == ["--perms", "0755", "--dir"]
