"""Where a writable bound directory could not be kept to data (no Landlock, no
write guard), the daemon says why, and the provisioner copies the files instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.base import FilesNotBindable
from jupyter_sandbox.control_plane.local import controller as controller_module
from jupyter_sandbox.control_plane.local.controller import LocalController
from jupyter_sandbox.control_plane.local.isolation import Isolation


@pytest.mark.parametrize(
    ("kind", "refusal", "read_only", "bound"),
    [
        ("bubblewrap", None, False, True),
        ("bubblewrap", "its write guard cannot run here (no libseccomp)", False, False),
        ("bubblewrap", "its write guard cannot run here (no libseccomp)", True, True),
        ("landlock", "this kernel has no Landlock (ABI 2, Linux 5.19)", False, False),
        # isolation turned off on purpose: nothing is kept out anyway
        ("none", "this kernel has no Landlock (ABI 2, Linux 5.19)", False, True),
    ],
)
def test_a_directory_is_bound_only_where_it_stays_data(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    refusal: str | None,
    read_only: bool,
    bound: bool,
) -> None:
    monkeypatch.setattr(controller_module, "bound_directory_refusal", lambda: refusal)
    folder = tmp_path / "project"
    folder.mkdir()
    controller = LocalController(tmp_path / "state", Isolation(kind, "test"))
    if bound:
        assert controller._bindable_files_dir(str(folder), read_only=read_only) == str(folder)
        return
    with pytest.raises(FilesNotBindable) as raised:
        controller._bindable_files_dir(str(folder), read_only=read_only)
    assert refusal is not None and refusal in raised.value.message
    assert "copied" in raised.value.hint
