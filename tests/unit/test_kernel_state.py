"""Saving and loading a namespace (runtime/kernel_state.py) against a stand-in IPython shell."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.runtime import kernel_state


class Shell:
    """What kernel_state uses of IPython's InteractiveShell."""

    def __init__(self, user_ns: dict[str, Any], count: int = 7) -> None:
        self.user_ns = user_ns
        self.user_ns_hidden = {"In": [], "Out": {}, "get_ipython": None}
        self.execution_count = count


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> Shell:
    current = Shell({})
    monkeypatch.setattr(kernel_state, "_shell", lambda: current)
    return current


def roundtrip(shell: Shell, tmp_path: Path, names: dict[str, Any], cap: int = 1 << 30) -> Any:
    shell.user_ns.clear()
    shell.user_ns.update(names)
    saved = kernel_state.save(str(tmp_path), cap)
    shell.user_ns.clear()
    shell.execution_count = 1
    restored = json.loads(kernel_state.restore_json(str(tmp_path)))
    return saved, restored


def make_point() -> Any:
    point_class = type("Point", (), {"norm": lambda self: (self.a**2 + self.b**2) ** 0.5})
    point = point_class()
    point.a, point.b = 3, 4
    return point


@pytest.mark.parametrize(
    ("name", "value", "check"),
    [
        ("number", 42, lambda v: v == 42),
        ("text", "héllo", lambda v: v == "héllo"),
        ("nested", {"a": [1, (2, 3)], "b": {4}}, lambda v: v == {"a": [1, (2, 3)], "b": {4}}),
        ("function", lambda x: 2 * x, lambda v: v(21) == 42),
        ("instance", make_point(), lambda v: v.norm() == 5.0),
        ("data", bytes(1000), lambda v: v == bytes(1000)),
    ],
)
def test_values_come_back(shell: Shell, tmp_path: Path, name: str, value: Any, check: Any) -> None:
    saved, restored = roundtrip(shell, tmp_path, {name: value})
    assert saved["saved"] == [name]
    assert name in restored["restored"]
    assert check(shell.user_ns[name])
    assert shell.execution_count == 7


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (socket.socket(), "socket"),
        (threading.Thread(target=print), "thread"),
        ((i for i in range(3)), "generator"),
        (threading.Lock(), "lock"),
    ],
)
def test_process_bound_objects_are_named_not_fatal(
    shell: Shell, tmp_path: Path, value: Any, reason: str
) -> None:
    saved, restored = roundtrip(shell, tmp_path, {"keep": 1, "gone": value})
    assert saved["skipped"] == {"gone": reason}
    assert shell.user_ns == {"keep": 1}
    assert restored["skipped"] == {"gone": reason}
    assert kernel_state.summary(restored) == f"restored 1 variable; not restored: gone ({reason})"


def test_modules_are_imported_again_by_name(shell: Shell, tmp_path: Path) -> None:
    import collections
    import json as js

    saved, _ = roundtrip(shell, tmp_path, {"co": collections, "js": js})
    assert saved["modules"] == {"co": "collections", "js": "json"}
    assert shell.user_ns["co"] is collections and shell.user_ns["js"] is js


def test_shared_objects_stay_shared(shell: Shell, tmp_path: Path) -> None:
    shared = [1, 2]
    roundtrip(shell, tmp_path, {"a": shared, "b": shared})
    assert shell.user_ns["a"] is shell.user_ns["b"]


def test_the_largest_variables_give_way_to_the_cap(shell: Shell, tmp_path: Path) -> None:
    saved, _ = roundtrip(
        shell, tmp_path, {"big": bytes(3 << 20), "small": 1, "medium": bytes(100)}, cap=1 << 20
    )
    assert saved["skipped"] == {"big": "larger than the 1 MB state limit"}
    assert set(shell.user_ns) == {"small", "medium"}


def test_internal_and_hidden_names_are_left_alone(shell: Shell, tmp_path: Path) -> None:
    saved, _ = roundtrip(shell, tmp_path, {"_private": 1, "In": [], "x": 2})
    assert saved["saved"] == ["x"]


def test_the_files_are_consumed_and_a_torn_save_is_never_loaded(
    shell: Shell, tmp_path: Path
) -> None:
    roundtrip(shell, tmp_path, {"x": 1})
    assert not kernel_state.has_state(str(tmp_path))
    (tmp_path / (kernel_state.STATE_FILE + ".tmp")).write_bytes(b"partial")
    assert not kernel_state.has_state(str(tmp_path))


def test_a_summary_of_nothing_says_so() -> None:
    # "restored 0 variables" read like a failure after a kernel that had none
    assert kernel_state.summary({"restored": [], "skipped": {}}) == (
        "there were no variables to bring back"
    )
    assert kernel_state.summary({"restored": [], "skipped": {"x": "a socket"}}) == (
        "restored 0 variables; not restored: x (a socket)"
    )
