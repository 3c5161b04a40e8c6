"""A kernel's variables across a suspend: saved to the workspace, loaded by the next kernel.

This module runs *inside the kernel process*: the runtime calls ``save`` before
the sandbox is suspended and ``restore`` in the new kernel when it resumes, each
as a silent execution. It works at the data level (dill), so it needs no
privileges and works on any backend, but it cannot carry what lives outside
the Python heap: sockets, threads, generators, open files, GPU handles. Those
are skipped by name with the reason, never fatal.

The state is written to a temporary file and renamed into place only when
complete, so a suspend that cuts a save short leaves nothing half-written to
load.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import socket
import threading
import time
import types
from typing import Any

STATE_FILE = "kernel-state.pkl"
MANIFEST_FILE = "kernel-state.json"
KEY_FILE = "kernel-key"  # the runtime's, not the kernel's (see runtime/state.py)

# Objects tied to the process: they do not survive it, whatever a pickler makes of them.
PROCESS_BOUND: tuple[tuple[type, str], ...] = (
    (socket.socket, "socket"),
    (threading.Thread, "thread"),
    (types.GeneratorType, "generator"),
    (types.CoroutineType, "coroutine"),
    (types.AsyncGeneratorType, "async generator"),
    (io.IOBase, "open file"),
    (type(threading.Lock()), "lock"),
)


class TooLarge(Exception):
    """The state would exceed its size cap."""


class _CappedWriter(io.RawIOBase):
    """A binary sink that counts what is written and refuses more than ``cap`` bytes."""

    def __init__(self, target: Any, cap: int) -> None:
        self.target = target
        self.cap = cap
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = len(memoryview(data).cast("B"))
        self.written += size
        if self.written > self.cap:
            raise TooLarge(self.written)
        if self.target is not None:
            self.target.write(data)
        return size


def _user_variables(shell: Any) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The notebook's own names: values, modules (alias -> name), and what cannot be kept."""
    hidden = set(getattr(shell, "user_ns_hidden", {}))
    values: dict[str, Any] = {}
    modules: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name, value in list(shell.user_ns.items()):
        if name.startswith("_") or name in hidden:
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        kind = next((label for cls, label in PROCESS_BOUND if isinstance(value, cls)), None)
        if kind is not None:
            skipped[name] = kind
            continue
        values[name] = value
    return values, modules, skipped


def _size(dill: Any, value: Any, cap: int) -> int:
    """Serialized size of ``value``, or ``cap + 1`` once it passes the cap."""
    sink = _CappedWriter(None, cap)
    try:
        dill.dump(value, sink, recurse=True)
    except TooLarge:
        return cap + 1
    return sink.written


def _drop_unpicklable(dill: Any, values: dict[str, Any], skipped: dict[str, str]) -> None:
    for name in list(values):
        try:
            dill.dumps(values[name], recurse=True)
        except Exception as exc:  # anything a pickler can raise
            skipped[name] = f"{type(values[name]).__name__}: {type(exc).__name__}"
            del values[name]


def _drop_largest(dill: Any, values: dict[str, Any], skipped: dict[str, str], cap: int) -> None:
    sizes = {name: _size(dill, value, cap) for name, value in values.items()}
    total = sum(sizes.values())
    for name in sorted(sizes, key=sizes.__getitem__, reverse=True):
        if total <= cap:
            break
        skipped[name] = f"larger than the {cap // (1 << 20)} MB state limit"
        total -= sizes[name]
        del values[name]


def _shell() -> Any:
    """The kernel's InteractiveShell."""
    from IPython import get_ipython

    return get_ipython()


def save(directory: str, max_bytes: int) -> dict[str, Any]:
    """Write the user namespace to ``directory``; return (and write) the manifest."""
    import dill  # only the kernel needs it

    started = time.monotonic()
    shell = _shell()
    values, modules, skipped = _user_variables(shell)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, STATE_FILE)
    tmp = path + ".tmp"
    for attempt in ("all", "picklable", "within the limit"):
        payload = {
            "values": values,
            "modules": modules,
            "execution_count": getattr(shell, "execution_count", None),
        }
        try:
            with open(tmp, "wb") as handle:
                sink = _CappedWriter(handle, max_bytes)
                dill.dump(payload, sink, recurse=True)
            break
        except TooLarge:
            _drop_largest(dill, values, skipped, max_bytes)
        except Exception:
            if attempt != "all":
                raise
            _drop_unpicklable(dill, values, skipped)
    os.replace(tmp, path)
    manifest = {
        "saved": sorted(values),
        "modules": modules,
        "skipped": skipped,
        "bytes": os.path.getsize(path),
        "seconds": round(time.monotonic() - started, 3),
    }
    _write_manifest(directory, manifest)
    return manifest


def restore(directory: str) -> dict[str, Any]:
    """Load what ``save`` wrote into this kernel's namespace; the files are consumed."""
    import dill

    path = os.path.join(directory, STATE_FILE)
    shell = _shell()
    previous = _read_manifest(directory)
    try:
        with open(path, "rb") as handle:
            payload = dill.load(handle)
    finally:
        discard(directory)
    failed: dict[str, str] = {}
    for alias, module in payload.get("modules", {}).items():
        try:
            shell.user_ns[alias] = importlib.import_module(module)
        except Exception as exc:
            failed[alias] = f"import {module}: {type(exc).__name__}"
    shell.user_ns.update(payload.get("values", {}))
    count = payload.get("execution_count")
    if isinstance(count, int) and count > 0:
        shell.execution_count = count
    restored = sorted(payload.get("values", {})) + sorted(
        a for a in payload.get("modules", {}) if a not in failed
    )
    return {"restored": restored, "skipped": {**previous.get("skipped", {}), **failed}}


def save_json(directory: str, max_bytes: int) -> str:
    """``save`` for the runtime, which reads the answer as a JSON string."""
    return json.dumps(save(directory, max_bytes))


def restore_json(directory: str) -> str:
    result = restore(directory)
    result["summary"] = summary(result)
    return json.dumps(result)


def discard(directory: str) -> None:
    for name in (STATE_FILE, STATE_FILE + ".tmp", MANIFEST_FILE, KEY_FILE):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def has_state(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, STATE_FILE))


def _write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    with open(os.path.join(directory, MANIFEST_FILE), "w") as handle:
        json.dump(manifest, handle)


def _read_manifest(directory: str) -> dict[str, Any]:
    try:
        with open(os.path.join(directory, MANIFEST_FILE)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def summary(result: dict[str, Any]) -> str:
    """'restored 14 variables; not restored: conn (socket), worker (thread)'."""
    restored = result.get("restored") or []
    skipped = result.get("skipped") or {}
    if not restored and not skipped:
        return "there were no variables to bring back"
    text = f"restored {len(restored)} variable{'s' if len(restored) != 1 else ''}"
    if skipped:
        text += "; not restored: " + named(skipped)
    return text


def named(skipped: dict[str, str]) -> str:
    """``conn (socket), worker (thread)``: what was left out, and why."""
    return ", ".join(f"{name} ({why})" for name, why in sorted(skipped.items()))
