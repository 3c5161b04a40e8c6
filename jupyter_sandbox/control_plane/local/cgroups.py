"""Per-sandbox resource limits with cgroups, for root and non-root daemons.

Unlike rlimits, a cgroup limit holds for everything a sandbox starts, together:
the memory limit also counts its tmpfs ``/tmp`` (shmem pages are charged to the
memory cgroup of the process that writes them, in v1 and v2), ``pids.max`` stops a
fork bomb whatever user ids it runs as, and the CPU quota caps the whole group.

Where the limits go:

* cgroup v2 (unified hierarchy, desktops with systemd): the daemon's own cgroup,
  if it is delegated to the daemon's user (writable, with the controllers listed in
  its ``cgroup.controllers``). systemd delegates ``user@UID.service`` to the user;
  to get a cgroup of its own start the daemon with
  ``systemd-run --user --scope -p Delegate=yes jupyter-sandbox ...``. Because of
  the "no internal processes" rule, the first ``create()`` moves the processes of
  that cgroup (the daemon itself) into a ``daemon`` leaf before it enables the
  controllers for the children. This path is exercised by unit tests against a fake
  cgroupfs only.
* cgroup v1 (separate ``memory``, ``pids`` and ``cpu`` hierarchies): the daemon's
  own cgroup in each hierarchy, when writable (in practice: the daemon runs as root).

The layout below that cgroup is ``jupyter-sandbox/<uid>/<sandbox name>``, so the
daemon's own limits (a systemd ``MemoryMax=``, say) bound its sandboxes too.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CONTROLLERS = ("memory", "pids", "cpu")
TOP_DIR = "jupyter-sandbox"
DAEMON_LEAF = "daemon"  # v2: where the daemon's own processes move
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000
REMOVE_TIMEOUT = 5.0


# ---------------------------------------------------------------------------
# Parsing /proc/self/mountinfo and /proc/self/cgroup (pure)


def _unescape(field_text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field_text):
        chunk = field_text[i : i + 4]
        if len(chunk) == 4 and chunk[0] == "\\" and chunk[1:].isdigit():
            out.append(chr(int(chunk[1:], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup filesystem mount: ``root`` is the part of the hierarchy mounted."""

    version: int  # 1 or 2
    mount_point: str
    root: str
    controllers: frozenset[str]  # v1: the super options naming controllers; v2: empty


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts listed in a mountinfo file."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, super_options = tail[0], tail[2]
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(CgroupMount(2, mount_point, root, frozenset()))
        elif fstype == "cgroup":
            options = frozenset(super_options.split(","))
            mounts.append(CgroupMount(1, mount_point, root, options & set(CONTROLLERS)))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map each v1 controller (and ``""`` for the v2 hierarchy) to the process's path."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths[""] = path
            continue
        for name in controllers.split(","):
            if name:
                paths[name] = path
    return paths


def cgroup_dir(mount: CgroupMount, path: str) -> str | None:
    """Where the cgroup ``path`` of a hierarchy appears under ``mount`` (None: not visible)."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/") and root:
        return None
    rel = path[len(root) :].lstrip("/")
    return os.path.join(mount.mount_point, rel) if rel else mount.mount_point


def cpu_max(fraction: float, period_us: int = CPU_PERIOD_US) -> tuple[int, int]:
    """(quota, period) in microseconds for a share of CPUs (1.5 = one and a half CPUs)."""
    if fraction <= 0:
        raise ValueError(f"cpu fraction must be positive, not {fraction}")
    return max(MIN_CPU_QUOTA_US, round(fraction * period_us)), period_us


def valid_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


# ---------------------------------------------------------------------------
# What can be enforced


@dataclass(frozen=True)
class Capability:
    version: int  # 1, 2, or 0 for none
    controllers: tuple[str, ...]
    detail: str
    dirs: Mapping[str, str] = field(default_factory=dict)  # controller -> daemon's cgroup

    @property
    def enforced(self) -> bool:
        return self.version != 0

    def __str__(self) -> str:
        if not self.enforced:
            return f"none: {self.detail}"
        return f"cgroup v{self.version}: {', '.join(self.controllers)}"


def _none(why: str) -> Capability:
    return Capability(0, (), why)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _writable(path: str) -> bool:
    return os.access(path, os.W_OK) and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)


def _probe_v1(mounts: list[CgroupMount], paths: dict[str, str]) -> Capability:
    dirs: dict[str, str] = {}
    missing: list[str] = []
    for name in CONTROLLERS:
        mount = next((m for m in mounts if m.version == 1 and name in m.controllers), None)
        path = paths.get(name)
        where = cgroup_dir(mount, path) if mount and path is not None else None
        if where is None or not os.path.isdir(where):
            missing.append(f"{name} (not mounted)")
        elif not _writable(where):
            missing.append(f"{name} ({where} not writable)")
        else:
            dirs[name] = where
    if not dirs:
        return _none("cgroup v1: no writable memory, pids or cpu hierarchy: " + ", ".join(missing))
    detail = "missing " + ", ".join(missing) if missing else "all controllers"
    return Capability(1, tuple(dirs), detail, dirs)


def _probe_v2(mounts: list[CgroupMount], paths: dict[str, str]) -> Capability:
    path = paths.get("")
    mount = next((m for m in mounts if m.version == 2), None)
    if mount is None or path is None:
        return _none("no cgroup2 mount")
    where = cgroup_dir(mount, path)
    if where is None or not os.path.isdir(where):
        return _none(f"cgroup v2: own cgroup {path} is not visible")
    try:
        available = set(_read(os.path.join(where, "cgroup.controllers")).split())
    except OSError as exc:
        return _none(f"cgroup v2: {exc}")
    controllers = tuple(c for c in CONTROLLERS if c in available)
    if not controllers:
        return _none(f"cgroup v2: no memory, pids or cpu controller in {where}")
    if not (_writable(where) and os.access(os.path.join(where, "cgroup.subtree_control"), os.W_OK)):
        return _none(
            f"cgroup v2: {where} is not delegated to uid {os.getuid()} "
            "(start the daemon with `systemd-run --user --scope -p Delegate=yes ...`)"
        )
    return Capability(2, controllers, f"delegated {where}", {"": where})


def probe_from(mountinfo: str, proc_cgroup: str) -> Capability:
    """Decide from the two files' text (and the cgroup filesystem's permissions)."""
    mounts = parse_mountinfo(mountinfo)
    paths = parse_proc_cgroup(proc_cgroup)
    v1 = _probe_v1(mounts, paths) if any(m.version == 1 for m in mounts) else None
    v2 = _probe_v2(mounts, paths)
    # Controllers live in one hierarchy or the other: prefer whichever has them.
    if v2.enforced and (v1 is None or len(v2.controllers) >= len(v1.controllers)):
        return v2
    if v1 is not None and v1.enforced:
        return v1
    reasons = [c.detail for c in (v1, v2) if c is not None]
    return _none("; ".join(reasons) or "no cgroup filesystem")


# ---------------------------------------------------------------------------
# One sandbox's cgroup


@dataclass(frozen=True)
class CgroupUsage:
    memory_bytes: int | None
    memory_peak_bytes: int | None
    pids: int | None
    oom_kills: int | None


def _read_int(path: str) -> int | None:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: str, key: str) -> int | None:
    """A value from a flat-keyed file such as memory.events or memory.oom_control."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _pids(procs_file: str) -> list[int]:
    try:
        return [int(p) for p in _read(procs_file).split()]
    except (OSError, ValueError):
        return []


class SandboxCgroup:
    """The cgroup(s) of one sandbox: one directory per v1 hierarchy, or one v2 directory."""

    def __init__(self, version: int, dirs: Mapping[str, str]) -> None:
        self.version = version
        self.dirs = dict(dirs)  # controller ("" for v2) -> directory
        self.procs_files = sorted({os.path.join(d, "cgroup.procs") for d in self.dirs.values()})
        self._enter_paths = [p.encode() for p in self.procs_files]

    def __repr__(self) -> str:
        return f"SandboxCgroup(v{self.version}, {sorted(set(self.dirs.values()))})"

    def enter(self) -> None:
        """Move the calling process into the cgroup: meant for ``preexec_fn``.

        Only ``os.open``/``os.write``/``os.close`` on byte paths prepared in advance.
        """
        for path in self._enter_paths:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def add(self, pid: int) -> None:
        """Move an already running process (and, in v2, nothing else) into the cgroup."""
        for path in self.procs_files:
            _write(path, str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files:
            found.update(_pids(path))
        return sorted(found)

    def control_file(self, controller: str, name: str) -> str:
        directory = self.dirs.get("") or self.dirs.get(controller)
        return os.path.join(directory, name) if directory else ""

    def usage(self) -> CgroupUsage:
        v2 = self.version == 2
        mem = self.control_file("memory", "memory.current" if v2 else "memory.usage_in_bytes")
        peak = self.control_file("memory", "memory.peak" if v2 else "memory.max_usage_in_bytes")
        events = self.control_file("memory", "memory.events" if v2 else "memory.oom_control")
        pids = self.control_file("pids", "pids.current")
        return CgroupUsage(
            _read_int(mem) if mem else None,
            _read_int(peak) if peak else None,
            _read_int(pids) if pids else None,
            _read_key(events, "oom_kill") if events else None,
        )

    def memory_peak(self) -> int | None:
        return self.usage().memory_peak_bytes

    def kill(self) -> None:
        """SIGKILL everything in the cgroup (``cgroup.kill`` where the kernel has it)."""
        kill_file = self.control_file("", "cgroup.kill") if self.version == 2 else ""
        if kill_file and os.path.exists(kill_file):
            try:
                _write(kill_file, "1")
                return
            except OSError:
                pass
        for _ in range(50):  # a process may fork while we kill: repeat until empty
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def remove(self, timeout: float = REMOVE_TIMEOUT) -> bool:
        """Kill what is left and remove the directories. True if all are gone."""
        self.kill()
        deadline = time.monotonic() + timeout
        remaining = sorted(set(self.dirs.values()))
        while remaining:
            remaining = [d for d in remaining if not _rmdir(d)]
            if not remaining or time.monotonic() > deadline:
                break
            self.kill()
            time.sleep(0.02)
        return not remaining


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise
    return True


# ---------------------------------------------------------------------------
# The daemon's view


class CgroupError(RuntimeError):
    pass


class CgroupLimits:
    """Creates per-sandbox cgroups below the daemon's own cgroup(s).

    ``mountinfo`` and ``proc_cgroup`` name the files to read (tests point them at
    samples describing a fake cgroup tree).
    """

    def __init__(
        self,
        *,
        mountinfo: str = "/proc/self/mountinfo",
        proc_cgroup: str = "/proc/self/cgroup",
        uid: int | None = None,
    ) -> None:
        self._mountinfo = mountinfo
        self._proc_cgroup = proc_cgroup
        self.uid = os.getuid() if uid is None else uid
        self._capability: Capability | None = None
        self._v2_prepared = False

    def probe(self) -> Capability:
        """What can be enforced here (cached)."""
        if self._capability is None:
            try:
                text = _read(self._mountinfo), _read(self._proc_cgroup)
            except OSError as exc:
                self._capability = _none(f"cannot read process information: {exc}")
            else:
                self._capability = probe_from(*text)
        return self._capability

    def parents(self) -> dict[str, str]:
        """controller ("" for v2) -> ``<daemon cgroup>/jupyter-sandbox/<uid>``."""
        return {c: os.path.join(d, TOP_DIR, str(self.uid)) for c, d in self.probe().dirs.items()}

    def create(
        self,
        name: str,
        *,
        memory_bytes: int | None = None,
        max_pids: int | None = None,
        cpu_quota_fraction: float | None = None,
    ) -> SandboxCgroup:
        """Create (or reuse) the sandbox's cgroup and write its limits."""
        if not valid_name(name):
            raise ValueError(f"invalid cgroup name {name!r}")
        capability = self.probe()
        if not capability.enforced:
            raise CgroupError(str(capability))
        if capability.version == 2:
            self._prepare_v2(capability.dirs[""])
        dirs = {c: os.path.join(p, name) for c, p in self.parents().items()}
        for directory in dirs.values():
            os.makedirs(directory, exist_ok=True)
        group = SandboxCgroup(capability.version, dirs)
        try:
            self._limit(group, capability, memory_bytes, max_pids, cpu_quota_fraction)
        except BaseException:
            group.remove(timeout=1)
            raise
        return group

    def _limit(
        self,
        group: SandboxCgroup,
        capability: Capability,
        memory_bytes: int | None,
        max_pids: int | None,
        cpu_fraction: float | None,
    ) -> None:
        wanted = {
            "memory": memory_bytes is not None,
            "pids": max_pids is not None,
            "cpu": cpu_fraction is not None,
        }
        lacking = [c for c, w in wanted.items() if w and c not in capability.controllers]
        if lacking:
            raise CgroupError(f"{capability}: cannot limit {', '.join(lacking)}")
        writes = (_v2_writes if capability.version == 2 else _v1_writes)(
            memory_bytes, max_pids, cpu_fraction
        )
        for controller, filename, value, optional in writes:
            path = group.control_file(controller, filename)
            if optional and not os.path.exists(path):
                continue
            _write(path, value)

    def _prepare_v2(self, own: str) -> None:
        """Empty the daemon's cgroup into a leaf so its children may get controllers."""
        if self._v2_prepared:
            return
        capability = self.probe()
        subtree = set(_read(os.path.join(own, "cgroup.subtree_control")).split())
        if not set(capability.controllers) <= subtree:
            leaf = os.path.join(own, DAEMON_LEAF)
            procs = _pids(os.path.join(own, "cgroup.procs"))
            if procs:
                os.makedirs(leaf, exist_ok=True)
                for pid in procs:
                    try:
                        _write(os.path.join(leaf, "cgroup.procs"), str(pid))
                    except ProcessLookupError:
                        pass
            _enable_v2(own, capability.controllers)
        # Each level down to the per-uid parent passes the controllers on.
        top = os.path.join(own, TOP_DIR)
        for directory in (top, os.path.join(top, str(self.uid))):
            os.makedirs(directory, exist_ok=True)
            _enable_v2(directory, capability.controllers)
        self._v2_prepared = True

    def sandboxes(self) -> list[str]:
        """Names of the sandbox cgroups that exist under this daemon's parent."""
        names: set[str] = set()
        for parent in self.parents().values():
            try:
                names.update(e.name for e in os.scandir(parent) if e.is_dir())
            except FileNotFoundError:
                continue
        return sorted(names)

    def group(self, name: str) -> SandboxCgroup:
        """The cgroup of an existing sandbox (for removing it after a restart)."""
        capability = self.probe()
        dirs = {c: os.path.join(p, name) for c, p in self.parents().items()}
        return SandboxCgroup(
            capability.version, {c: d for c, d in dirs.items() if os.path.isdir(d)}
        )

    def remove_parents(self) -> None:
        """Remove the ``jupyter-sandbox/<uid>`` directories if no sandbox is left in them."""
        for parent in self.parents().values():
            for directory in (parent, os.path.dirname(parent)):
                try:
                    os.rmdir(directory)
                except OSError:
                    break  # missing, or still in use (another uid, the v2 daemon leaf)

    def remove_stale(self, keep: Iterable[str] = (), kill: bool = False) -> list[str]:
        """Remove sandbox cgroups not in ``keep``; those with processes only if ``kill``.

        Returns the names removed.
        """
        keep = set(keep)
        removed: list[str] = []
        for name in self.sandboxes():
            if name in keep:
                continue
            group = self.group(name)
            if group.pids() and not kill:
                continue
            if group.remove(timeout=1):
                removed.append(name)
        return removed


def _v1_writes(
    memory_bytes: int | None, max_pids: int | None, cpu_fraction: float | None
) -> list[tuple[str, str, str, bool]]:
    """(controller, file, value, optional) in the order they must be written."""
    writes: list[tuple[str, str, str, bool]] = []
    if memory_bytes is not None:
        writes.append(("memory", "memory.limit_in_bytes", str(memory_bytes), False))
        # memsw (memory + swap) must not be below the memory limit: write it second.
        writes.append(("memory", "memory.memsw.limit_in_bytes", str(memory_bytes), True))
    if max_pids is not None:
        writes.append(("pids", "pids.max", str(max_pids), False))
    if cpu_fraction is not None:
        quota, period = cpu_max(cpu_fraction)
        writes.append(("cpu", "cpu.cfs_period_us", str(period), False))
        writes.append(("cpu", "cpu.cfs_quota_us", str(quota), False))
    return writes


def _v2_writes(
    memory_bytes: int | None, max_pids: int | None, cpu_fraction: float | None
) -> list[tuple[str, str, str, bool]]:
    writes: list[tuple[str, str, str, bool]] = []
    if memory_bytes is not None:
        writes.append(("memory", "memory.max", str(memory_bytes), False))
        writes.append(("memory", "memory.swap.max", "0", True))
    if max_pids is not None:
        writes.append(("pids", "pids.max", str(max_pids), False))
    if cpu_fraction is not None:
        quota, period = cpu_max(cpu_fraction)
        writes.append(("cpu", "cpu.max", f"{quota} {period}", False))
    return writes


def _enable_v2(directory: str, controllers: Iterable[str]) -> None:
    """Let the children of ``directory`` use ``controllers`` (cgroup.subtree_control)."""
    path = os.path.join(directory, "cgroup.subtree_control")
    enabled = set(_read(path).split()) if os.path.exists(path) else set()
    missing = [c for c in controllers if c not in enabled]
    if missing:
        _write(path, " ".join(f"+{c}" for c in missing))
