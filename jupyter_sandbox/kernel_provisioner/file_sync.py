"""The notebook's directory copied into a sandbox's workspace, and the kernel's changes back.

For sandboxes that cannot see the user's files (a Kubernetes pod, or a kernelspec
that asks for a copy), the provisioner copies the notebook's directory into the
workspace once the sandbox is claimed, through the runtime's upload API, and
copies what the kernel created or changed back at suspend, at shutdown and on
demand. It works the same on every backend, because it only uses the runtime's
file API through the router.

The sandbox is untrusted in both directions:

- In: only regular files, never symlinks (a link in the notebook's directory must
  not hand over what it points to), never hidden entries (``.git``, ``.ssh``,
  ``.ipynb_checkpoints``, ``.venv`` ...) and never the usual bulky caches; size-bounded.
- Back: names are checked one component at a time, hidden entries are never
  written (no git hook or shell profile can be planted), files are written without
  their execute bit, never through a symlink, and the total is bounded. A file the
  user changed on the host since it was copied in is not overwritten: the
  sandbox's version is written next to it and the conflict is reported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..control_plane.base import Endpoint
from ..runtime import guarded_names
from . import runtime_files

log = logging.getLogger(__name__)

# Directories nobody wants copied into a sandbox (hidden ones are skipped anyway).
# Besides the names guarded_names.py refuses (__pycache__, .pyc, conftest.py, ...).
EXCLUDED_DIRS = frozenset({"node_modules", "venv", "env", "site-packages"})
EXCLUDED_SUFFIXES = (".pyo",)
MAX_DEPTH = 32


@dataclass(frozen=True)
class Limits:
    max_files: int = 5000
    max_file_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024


@dataclass
class SyncReport:
    """What one copy did: in words for the user, in lists for the API."""

    direction: str  # "in" | "back"
    copied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (path, written as)
    bytes: int = 0
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "copied": self.copied,
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "conflicts": [{"path": p, "written_as": w} for p, w in self.conflicts],
            "bytes": self.bytes,
            "at": self.at,
        }

    def summary(self) -> str:
        verb = "copied into the sandbox" if self.direction == "in" else "copied back"
        text = f"{len(self.copied)} file(s) {verb} ({_size(self.bytes)})"
        if self.conflicts:
            text += "; changed on both sides, kept both: " + ", ".join(
                f"{p} -> {w}" for p, w in self.conflicts[:5]
            )
        if self.skipped:
            text += "; skipped: " + ", ".join(f"{p} ({r})" for p, r in self.skipped[:5])
            if len(self.skipped) > 5:
                text += f" and {len(self.skipped) - 5} more"
        return text


class FileSyncError(runtime_files.RuntimeFileError):
    """A copy refused on the host's side (names, directories, nothing to copy).

    The runtime's own refusals arrive as ``RuntimeFileError``, its base: callers
    catch that one.
    """


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


def valid_component(name: str) -> bool:
    """A single path component that may be copied (in either direction)."""
    return (
        bool(name)
        and name not in (".", "..")
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and name not in EXCLUDED_DIRS
        and not name.endswith(EXCLUDED_SUFFIXES)
        # what a bound directory's write guard keeps out (conftest.py, HEAD, .pth, ...)
        and guarded_names.refusal(name) is None
    )


def collect(root: str, limits: Limits) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """Regular files under ``root`` to copy in, as (relative path, size), and what was skipped."""
    files: list[tuple[str, int]] = []
    skipped: list[tuple[str, str]] = []
    total = 0

    def walk(directory: str, prefix: str, depth: int) -> None:
        nonlocal total
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            skipped.append((prefix or ".", f"unreadable: {exc.strerror}"))
            return
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            if not valid_component(entry.name):
                continue
            if entry.is_symlink():
                skipped.append((rel, "a symlink"))
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth >= MAX_DEPTH:
                    skipped.append((rel, "too deep"))
                else:
                    walk(entry.path, rel + "/", depth + 1)
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            size = entry.stat(follow_symlinks=False).st_size
            if size > limits.max_file_bytes:
                skipped.append((rel, f"larger than {_size(limits.max_file_bytes)}"))
            elif len(files) >= limits.max_files:
                skipped.append((rel, f"over {limits.max_files} files"))
            elif total + size > limits.max_total_bytes:
                skipped.append((rel, f"over {_size(limits.max_total_bytes)} in all"))
            else:
                files.append((rel, size))
                total += size

    walk(root, "", 0)
    return files, skipped


def conflict_name(rel: str, taken: Callable[[str], bool]) -> str:
    """Where the sandbox's version of a file changed on both sides goes: ``a.from-sandbox.csv``."""
    directory, name = os.path.split(rel)
    stem, dot, suffix = name.rpartition(".")
    if not stem:  # no extension (or a leading dot, which never gets here)
        stem, dot, suffix = name, "", ""
    for n in range(1, 1000):
        tag = ".from-sandbox" if n == 1 else f".from-sandbox-{n}"
        candidate = os.path.join(directory, f"{stem}{tag}{dot}{suffix}")
        if not taken(candidate):
            return candidate
    raise FileSyncError(f"no free name for the sandbox's version of {rel}")


class FileSync:
    """Copies one notebook directory into one sandbox and the kernel's changes back."""

    def __init__(self, root: str, limits: Limits | None = None) -> None:
        self.root = os.path.realpath(root)
        self.limits = limits or Limits()
        # Host state at copy-in (or our last write): rel -> (size, mtime_ns).
        self._host: dict[str, tuple[int, int]] = {}
        # Sandbox state after the last copy: rel -> (size, mod_time).
        self._sandbox: dict[str, tuple[int, float]] = {}
        self.last: SyncReport | None = None
        self.first: SyncReport | None = None

    # -- in ------------------------------------------------------------------

    async def copy_in(self, endpoint: Endpoint) -> SyncReport:
        report = SyncReport("in")
        files, report.skipped = collect(self.root, self.limits)
        if files:
            parts = [runtime_files.UploadPart(rel, size, self._opener(rel)) for rel, size in files]
            await runtime_files.upload(endpoint, parts)
        for rel, size in files:
            st = os.stat(os.path.join(self.root, rel), follow_symlinks=False)
            self._host[rel] = (st.st_size, st.st_mtime_ns)
            report.copied.append(rel)
            report.bytes += size
        self._sandbox = await self._list(endpoint)
        self.first = self.last = report
        return report

    def _opener(self, rel: str) -> Callable[[], BinaryIO]:
        return lambda: open(os.path.join(self.root, rel), "rb")

    async def adopt(self, endpoint: Endpoint) -> None:
        """Take over a sandbox copied into by an earlier run of the server (no copy-in)."""
        self._sandbox = await self._list(endpoint)
        for rel in self._sandbox:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(self.root, rel), follow_symlinks=False)
                self._host[rel] = (st.st_size, st.st_mtime_ns)

    # -- back ----------------------------------------------------------------

    async def copy_back(self, endpoint: Endpoint) -> SyncReport:
        """Copy what the kernel created or changed since the last copy back to the host."""
        report = SyncReport("back")
        now = await self._list(endpoint)
        changed = [rel for rel, seen in sorted(now.items()) if self._sandbox.get(rel) != seen]
        budget = self.limits.max_total_bytes
        for rel in changed:
            size = now[rel][0]
            if size > self.limits.max_file_bytes or size > budget:
                report.skipped.append((rel, "too large to copy back"))
                continue
            if len(report.copied) + len(report.conflicts) >= self.limits.max_files:
                report.skipped.append((rel, f"over {self.limits.max_files} files"))
                continue
            try:
                written = await self._write_back(endpoint, rel, size)
            except (runtime_files.RuntimeFileError, OSError) as exc:
                report.skipped.append((rel, str(exc)))
                continue
            budget -= size
            report.bytes += size
            if written == rel:
                report.copied.append(rel)
            else:
                report.conflicts.append((rel, written))
            self._sandbox[rel] = now[rel]
        self.last = report
        return report

    async def _write_back(self, endpoint: Endpoint, rel: str, size: int) -> str:
        directory = self._host_dir(os.path.dirname(rel))
        target = os.path.join(directory, os.path.basename(rel))
        expected = self._host.get(rel)
        try:
            st: os.stat_result | None = os.stat(target, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if expected is None:  # not copied in: new on both sides if the host has it now
            unchanged = st is None
        else:
            unchanged = (
                st is not None
                and stat.S_ISREG(st.st_mode)
                and (st.st_size, st.st_mtime_ns) == expected
            )
        dest_rel = rel if unchanged else conflict_name(rel, self._taken)
        dest = os.path.join(self.root, dest_rel)
        fd, temp = tempfile.mkstemp(prefix=".sandbox-copy-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                await runtime_files.download(endpoint, rel, handle.write, size)
            os.chmod(temp, 0o644)  # never the execute bit the sandbox gave it
            os.replace(temp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        if dest_rel == rel:
            st = os.stat(dest, follow_symlinks=False)
            self._host[rel] = (st.st_size, st.st_mtime_ns)
        return dest_rel

    def _taken(self, rel: str) -> bool:
        return os.path.lexists(os.path.join(self.root, rel))

    def _host_dir(self, rel_dir: str) -> str:
        """The host directory for ``rel_dir``, made if missing, never through a symlink."""
        path = self.root
        for part in [p for p in rel_dir.split("/") if p]:
            if not valid_component(part):
                raise FileSyncError(f"refused name {part!r}")
            path = os.path.join(path, part)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                pass
            st = os.stat(path, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise FileSyncError(f"{path} on the host is not a directory")
        return path

    async def _list(self, endpoint: Endpoint) -> dict[str, tuple[int, float]]:
        """Every regular, visible file in the workspace: rel -> (size, mod_time)."""
        found: dict[str, tuple[int, float]] = {}
        pending = [("", 0)]
        while pending:
            prefix, depth = pending.pop()
            entries = await runtime_files.list_dir(endpoint, prefix)
            for entry in entries:
                name = str(entry.get("name", ""))
                if not valid_component(name):
                    continue
                if entry.get("type") == "directory":
                    if depth < MAX_DEPTH:
                        pending.append((f"{prefix}{name}/", depth + 1))
                    continue
                if len(found) >= self.limits.max_files * 2:
                    return found  # an attacker's million files stop here
                found[prefix + name] = (int(entry.get("size", 0)), float(entry.get("mod_time", 0)))
        return found


__all__ = ["FileSync", "FileSyncError", "Limits", "SyncReport", "collect", "conflict_name"]
