"""What the write guard does with each stopped call, decided for real on real
directories, without seccomp: the caller's memory and view are given."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from jupyter_sandbox.runtime import landlock
from jupyter_sandbox.runtime.write_guard import (
    AT_FDCWD,
    Answer,
    Caller,
    Continue,
    Descriptor,
    Guard,
    GuardLayer,
    where,
)

OPENAT, MKDIRAT, RENAMEAT2, TRUNCATE, OPEN = 1, 2, 3, 4, 5
NUMBERS = {OPENAT: "openat", MKDIRAT: "mkdirat", RENAMEAT2: "renameat2", TRUNCATE: "truncate"}
NUMBERS[OPEN] = "open"
WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


class FakeCaller(Caller):
    """A caller whose strings sit at small addresses, working in ``cwd``."""

    def __init__(self, cwd: Path, strings: list[str], umask: int = 0o022) -> None:
        super().__init__(pid=0)
        self.cwd = str(cwd)
        self.strings = strings
        self._umask = umask

    def string(self, address: int) -> bytes:
        return self.strings[address - 1].encode()

    def directory(self, dirfd: int) -> str | None:
        assert dirfd == AT_FDCWD
        return self.cwd

    def umask(self) -> int:
        return self._umask


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path, Guard]:
    """``top/project`` bound, ``top/granted`` left to the caller, ``top`` itself an
    ancestor (made after the start, as a sandbox's /tmp may be)."""
    bound = tmp_path / "project"
    granted = tmp_path / "granted"
    bound.mkdir()
    granted.mkdir()
    (bound / "data.csv").write_text("a\n")
    (bound / ".vscode").mkdir()
    (bound / ".vscode" / "settings.json").write_text("{}")
    (bound / "settings-link").symlink_to(".vscode/settings.json")
    rules = landlock.Rules(landlock.GUARDED_WRITES, ())
    layer = GuardLayer(rules, str(bound), (str(granted),))
    return bound, granted, Guard(layer, NUMBERS)


def decide(guard: Guard, cwd: Path, nr: int, strings: list[str], *args: int) -> object:
    caller = FakeCaller(cwd, strings)
    return guard.decide(caller, nr, (*args, 0, 0, 0, 0, 0, 0)[:6])


def test_where_a_path_lies(places: tuple[Path, Path, Guard]) -> None:
    bound, granted, guard = places
    assert where(str(bound), guard.layer) == "bound"
    assert where(str(bound / "sub"), guard.layer) == "bound"
    assert where(str(bound) + "-sibling", guard.layer) == "other"
    assert where(str(granted / "x"), guard.layer) == "granted"
    assert where(str(bound.parent), guard.layer) == "other"


def test_a_plain_file_is_opened_for_the_caller(places: tuple[Path, Path, Guard]) -> None:
    bound, _, guard = places
    action = decide(guard, bound, OPENAT, ["out.csv"], AT_FDCWD, 1, WRITE | os.O_CLOEXEC, 0o666)
    assert isinstance(action, Descriptor) and action.cloexec
    os.write(action.fd, b"written by the guard")
    os.close(action.fd)
    made = bound / "out.csv"
    assert made.read_text() == "written by the guard"
    assert made.stat().st_mode & 0o777 == 0o644  # the caller's umask


@pytest.mark.parametrize(
    "path",
    ["conftest.py", "sub/.git/config", ".GIT", "__pycache__/m.pyc", ".vscode/settings.json"],
)
def test_a_guarded_name_is_refused_and_not_made(
    places: tuple[Path, Path, Guard], path: str
) -> None:
    bound, _, guard = places
    (bound / "sub").mkdir()
    action = decide(guard, bound, OPENAT, [path], AT_FDCWD, 1, WRITE, 0o644)
    assert action == Answer(error=errno.EPERM)
    assert (bound / ".vscode" / "settings.json").read_text() == "{}"
    assert not (bound / "conftest.py").exists()


def test_a_users_link_to_a_guarded_name_is_followed_and_refused(
    places: tuple[Path, Path, Guard],
) -> None:
    bound, _, guard = places
    action = decide(guard, bound, OPEN, ["settings-link"], 1, os.O_WRONLY)
    assert action == Answer(error=errno.EPERM)


def test_elsewhere_the_callers_own_call_goes_on(places: tuple[Path, Path, Guard]) -> None:
    bound, granted, guard = places
    assert decide(guard, bound, OPENAT, [f"{granted}/x"], AT_FDCWD, 1, WRITE) == Continue()
    assert decide(guard, bound, OPENAT, ["/proc/self/fd/3"], AT_FDCWD, 1, os.O_WRONLY) == Continue()
    assert decide(guard, bound, 999, [], 0) == Continue()  # not a call the guard knows


def test_an_ancestor_is_written_by_the_guard(places: tuple[Path, Path, Guard]) -> None:
    """The guard layer grants nothing directly in the bound directory's ancestors
    (a sandbox's /tmp above a bound /tmp/project): the guard writes there."""
    bound, _, guard = places
    action = decide(guard, bound, OPENAT, ["../scratch.txt"], AT_FDCWD, 1, WRITE, 0o600)
    assert isinstance(action, Descriptor)
    os.close(action.fd)
    assert (bound.parent / "scratch.txt").exists()


def test_directories(places: tuple[Path, Path, Guard]) -> None:
    bound, _, guard = places
    assert decide(guard, bound, MKDIRAT, ["results"], AT_FDCWD, 1, 0o777) == Answer()
    assert (bound / "results").is_dir()
    assert (bound / "results").stat().st_mode & 0o777 == 0o755
    assert decide(guard, bound, MKDIRAT, ["results/.hg"], AT_FDCWD, 1, 0o777) == Answer(
        error=errno.EPERM
    )
    assert decide(guard, bound, MKDIRAT, ["results"], AT_FDCWD, 1, 0o777) == Answer(
        error=errno.EEXIST
    )


def test_renames(places: tuple[Path, Path, Guard]) -> None:
    bound, granted, guard = places
    (granted / "repo" / ".git").mkdir(parents=True)
    (granted / "a").write_text("a")
    args = (AT_FDCWD, 1, AT_FDCWD, 2, 0)
    # into the bound directory from elsewhere: copied instead, entry by entry
    moved_in = decide(guard, bound, RENAMEAT2, [f"{granted}/repo", "repo"], *args)
    assert moved_in == Answer(error=errno.EXDEV)
    assert decide(guard, bound, RENAMEAT2, ["data.csv", ".envrc"], *args) == Answer(
        error=errno.EPERM
    )
    assert decide(guard, bound, RENAMEAT2, [".vscode", "vscode"], *args) == Answer(
        error=errno.EPERM
    )
    assert decide(guard, bound, RENAMEAT2, ["data.csv", "renamed.csv"], *args) == Answer()
    assert (bound / "renamed.csv").read_text() == "a\n"
    both_granted = decide(guard, bound, RENAMEAT2, [f"{granted}/a", f"{granted}/b"], *args)
    assert both_granted == Continue()


def test_truncate(places: tuple[Path, Path, Guard]) -> None:
    bound, _, guard = places
    assert decide(guard, bound, TRUNCATE, ["data.csv"], 1, 1) == Answer()
    assert (bound / "data.csv").read_text() == "a"
    assert decide(guard, bound, TRUNCATE, ["settings-link"], 1, 0) == Answer(error=errno.EPERM)
    assert (bound / ".vscode" / "settings.json").read_text() == "{}"


def test_the_guard_layer_grants_beside_the_path_never_above(tmp_path: Path) -> None:
    bound = tmp_path / "a" / "project"
    bound.mkdir(parents=True)
    (tmp_path / "a" / "sibling").mkdir()
    layer = landlock.guard_layer(str(bound), abi=3)
    assert str(tmp_path / "a" / "sibling") in layer.granted
    assert not any(
        str(bound).startswith(g.rstrip("/") + "/") or g == str(bound) for g in layer.granted
    )
    assert ("/", landlock.REFER) in layer.rules.grants  # moves between directories elsewhere
    assert layer.rules.handled == landlock.GUARDED_WRITES | landlock.REFER


def test_a_users_home_keeps_its_dotfiles_but_not_the_packages(tmp_path: Path) -> None:
    """Kubernetes, the user's volume: their own server and shells read its top's
    hidden entries; %pip writes the project's packages beneath .local."""
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    kept = home / ".local/share/jupyter-sandbox/packages/0123"
    layer = landlock.guard_layer(str(home), abi=3)
    guard = Guard(layer, NUMBERS, home=True, kept=str(kept))
    refused = Answer(error=errno.EPERM)
    config = ".jupyter/jupyter_server_config.py"
    assert decide(guard, home, MKDIRAT, [".jupyter"], AT_FDCWD, 1, 0o755) == refused
    assert decide(guard, home, OPENAT, [".bashrc"], AT_FDCWD, 1, WRITE, 0o644) == refused
    assert decide(guard, home, OPENAT, [config], AT_FDCWD, 1, WRITE, 0o644) == refused
    way = [".local", ".local/share", ".local/share/jupyter-sandbox", str(kept.parent), str(kept)]
    for part in way:
        assert decide(guard, home, MKDIRAT, [part], AT_FDCWD, 1, 0o755) == Answer()
    made = decide(guard, home, OPENAT, [f"{kept}/x.pth"], AT_FDCWD, 1, WRITE, 0o644)
    assert isinstance(made, Descriptor)
    os.close(made.fd)
    made = decide(guard, home, OPENAT, ["project/out.csv"], AT_FDCWD, 1, WRITE, 0o644)
    assert isinstance(made, Descriptor)
    os.close(made.fd)
    assert decide(guard, home, MKDIRAT, ["project/.git"], AT_FDCWD, 1, 0o755) == refused
    assert not (home / ".jupyter").exists() and not (home / ".bashrc").exists()


def test_what_the_guard_makes_has_no_set_id_bit(places: tuple[Path, Path, Guard]) -> None:
    bound, _, guard = places
    action = decide(guard, bound, OPENAT, ["tool"], AT_FDCWD, 1, WRITE, 0o6755)
    assert isinstance(action, Descriptor)
    os.close(action.fd)
    assert decide(guard, bound, MKDIRAT, ["shared"], AT_FDCWD, 1, 0o2775) == Answer()
    assert (bound / "tool").stat().st_mode & 0o7777 == 0o755
    assert (bound / "shared").stat().st_mode & 0o7777 == 0o755
