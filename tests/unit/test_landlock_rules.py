"""Landlock policies and the rules they become (runtime/landlock.py): the bound
directory as data, the sandbox's own places, what crosses to the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_sandbox.runtime import landlock


def test_the_bound_tree_is_data_only_and_the_sandboxs_own_places_are_not(
    tmp_path: Path,
) -> None:
    for d in ("usr", "workspace", "notebooks/project"):
        (tmp_path / d).mkdir(parents=True)
    policy = landlock.Policy(
        read_only=(str(tmp_path / "usr"), str(tmp_path / "gone")),
        read_write=(str(tmp_path / "workspace"),),
        data_only=str(tmp_path / "notebooks/project"),
        connect_ports=None,
    )
    rules = policy.rules(abi=6)
    grants = {str(Path(p).relative_to(tmp_path)): r for p, r in rules.grants if p != "/dev"}
    everything = landlock.FS_RIGHTS[5]
    assert grants == {
        "usr": landlock.READ,  # (a path that does not exist is left out)
        "workspace": everything,
        "notebooks/project": everything & ~landlock.SPECIAL_FILES,
    }
    assert rules.handled_net == 0 and rules.ports == ()  # TCP left to the namespace
    assert landlock.Policy(("/usr",), ("/w",)).rules(abi=6).ports == (53, 80, 443)


def test_beneath_a_read_write_place_only_the_directories_beside_the_path_keep_special_files(
    tmp_path: Path,
) -> None:
    """Rights add up down a hierarchy: a notebook directory under the sandbox's /tmp
    would get /tmp's special files back. /tmp keeps them only beside the path."""
    tmp = tmp_path / "tmp"
    for d in ("pytest/run-1/project/sub", "pytest/run-0", "pymp-1"):
        (tmp / d).mkdir(parents=True)
    (tmp / "pytest" / "notes.txt").write_text("a file, not a hierarchy")
    (tmp / "link").symlink_to(tmp_path)
    bound = tmp / "pytest/run-1/project"
    rules = landlock.Policy((), (str(tmp),), str(bound), None).rules(abi=6)
    grants = {str(Path(p).relative_to(tmp_path)): r for p, r in rules.grants if p != "/dev"}
    everything = landlock.FS_RIGHTS[5]
    assert grants == {
        "tmp": everything & ~landlock.SPECIAL_FILES,
        "tmp/pymp-1": landlock.SPECIAL_FILES,
        "tmp/pytest/run-0": landlock.SPECIAL_FILES,
        "tmp/pytest/run-1/project": everything & ~landlock.SPECIAL_FILES,
    }


def test_a_source_checkout_on_the_path_is_listed_not_read(tmp_path: Path) -> None:
    """An editable install puts its checkout on the kernel's path; the importer
    lists it to find the package (the kernel could not import it as an ordinary
    user, whose checkout is not under the sandbox's /tmp), nothing more."""
    (tmp_path / "src" / "jupyter_sandbox").mkdir(parents=True)
    package = str(tmp_path / "src" / "jupyter_sandbox")
    policy = landlock.Policy((package,), (), list_only=(str(tmp_path / "src"),))
    grants = dict(policy.rules(abi=6).grants)
    assert grants[str(tmp_path / "src")] == landlock.READ_DIR
    assert grants[package] == landlock.READ


def test_a_policy_crosses_to_the_runtime_unchanged() -> None:
    for policy in (
        landlock.Policy(("/usr", "/etc/hosts"), ("/workspace",), "/srv/nb", None),
        landlock.Policy(("/usr",), ("/w", "/dev/shm"), None, (53, 443), ("/src",)),
    ):
        assert landlock.Policy.from_json(policy.to_json()) == policy


def test_inside_bubblewrap_the_second_layer_names_the_sandboxs_own_paths() -> None:
    from jupyter_sandbox.control_plane.local import isolation

    confinement = isolation.Confinement(files_dir="/srv/notebooks/p", pool_packages="/x")
    policy = isolation.landlock_policy_inside(confinement)
    assert set(policy.read_write) == {"/workspace", "/run/sandbox", "/tmp", "/dev/shm"}
    assert isolation.POOL_PACKAGES in policy.read_only and "/proc" in policy.read_only
    assert policy.data_only == "/srv/notebooks/p" and policy.connect_ports is None
    read_only = isolation.landlock_policy_inside(
        isolation.Confinement(files_dir="/srv/notebooks/p", files_read_only=True)
    )
    assert read_only.data_only is None and "/srv/notebooks/p" in read_only.read_only


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
    from jupyter_sandbox.control_plane.local.isolation import PROC_GLOBAL, landlock_policy

    policy = landlock_policy(workspace="/nonexistent-ws", runtime_dir="/nonexistent-run")
    rules = policy.rules()
    granted = [path for path, _ in rules.grants]
    assert "/proc" not in granted and "/proc/self" not in granted
    assert set(PROC_GLOBAL) & set(granted)
