"""Where %pip installs in a sandbox: the workspace, unless the launcher chose already."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_sandbox.runtime.__main__ import pip_target_env


def test_a_pod_gets_its_packages_in_the_workspace(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin", "PYTHONPATH": "/opt/lib"}
    pip_target_env(env)
    packages = str(tmp_path / ".local" / "packages")
    assert env["PIP_TARGET"] == packages
    assert os.path.isdir(packages), "made at start, so later installs import"
    assert env["PYTHONPATH"].split(os.pathsep) == ["/opt/lib", packages]
    assert env["PATH"].split(os.pathsep)[-1] == f"{packages}/bin"


def test_a_launcher_that_chose_is_left_alone(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PIP_TARGET": "/elsewhere", "PATH": "/usr/bin"}
    pip_target_env(env)
    assert env == {"HOME": str(tmp_path), "PIP_TARGET": "/elsewhere", "PATH": "/usr/bin"}
    assert not (tmp_path / ".local").exists()


def test_a_pod_on_the_users_volume_keeps_packages_with_the_project(tmp_path: Path) -> None:
    kept = tmp_path / "home" / ".local" / "share" / "jupyter-sandbox" / "packages" / "abc"
    env = {"HOME": str(tmp_path / "workspace"), "PATH": "/usr/bin"}
    pip_target_env(env, str(kept))
    assert env["PIP_TARGET"] == str(kept)
    assert kept.is_dir()
    assert env["PYTHONPATH"] == str(kept)


def test_packages_stay_in_the_workspace_when_the_kept_place_cannot_be_made(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin"}
    pip_target_env(env, str(blocker / "packages"))
    assert env["PIP_TARGET"] == str(tmp_path / ".local" / "packages")
