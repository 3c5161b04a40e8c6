"""The local daemon's objects, shaped like agent-sandbox's resources, and their store."""

from __future__ import annotations

import json
import os
import re
import secrets
import string
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..base import InvalidRequest, Phase
from .packages import check_requirements

NAME = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,40}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
MAX_LABEL_VALUE = 253
NAMESPACE = "local"
DEFAULT_TMP_MB = 1024
# A pool that names no memory limit gets this much where cgroups enforce one (the
# whole sandbox: kernel, commands, /tmp and /dev/shm), at most half the machine.
DEFAULT_MEMORY_MB = 4096
# ... and no more processes and threads than this, whether by cgroup or rlimit.
DEFAULT_MAX_PROCESSES = 1024
# A workspace may hold this much (a root daemon enforces it, disk_images.py; an
# ordinary user's watches it, disk_usage.py).
DEFAULT_DISK_MB = 10240


def check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidRequest(
            f"{kind} name {name!r} is not valid",
            hint="use 1-42 lower-case letters, digits and '-', starting and ending alphanumeric",
        )
    return name


def check_labels(labels: Any) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise InvalidRequest("labels must be an object of strings")
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise InvalidRequest(f"label key {key!r} is not valid")
        if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE:
            raise InvalidRequest(f"label {key!r} must be a string of at most 253 characters")
    return dict(labels)


def random_suffix(length: int = 5) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


FILES_READ_WRITE = "rw"
FILES_READ_ONLY = "ro"
FILES_NONE = "none"
FILES_MODES = (FILES_READ_WRITE, FILES_READ_ONLY, FILES_NONE)


@dataclass
class PoolSpec:
    """A SandboxTemplate and a SandboxWarmPool in one: what to start and how many to keep warm."""

    name: str
    replicas: int = 2
    kernel_name: str = "python3"
    display_name: str = ""
    network: bool = True
    memory_mb: int | None = None
    cpu_seconds: int | None = None
    max_processes: int | None = None
    cpus: float | None = None  # CPU quota in cores (a cgroup limit)
    tmp_mb: int | None = None  # size of the private /tmp (default: see tmp_bytes)
    disk_mb: int | None = None  # what a workspace may hold (default DEFAULT_DISK_MB; 0: none)
    keep_workspace: bool = False
    save_state: bool = True  # keep the kernel's variables across a suspend
    state_max_mb: int = 1024  # ... unless they take more than this
    state_timeout: float = 60.0  # ... or longer than this to save
    env: dict[str, str] = field(default_factory=dict)
    # The notebook's directory in the sandbox: read-write, read-only, or not at all.
    files: str = FILES_READ_WRITE
    # Requirement lines the daemon installs once for the pool's sandboxes (read-only).
    requirements: list[str] = field(default_factory=list)
    # Forward the host pip's index, trusted hosts and CA bundle (never credentials).
    pip_config: bool = True

    @classmethod
    def from_json(cls, name: str, body: dict[str, Any]) -> PoolSpec:
        check_name("pool", name)
        known = set(cls.__dataclass_fields__) - {"name"}
        unknown = set(body) - known
        if unknown:
            raise InvalidRequest(f"unknown pool fields: {', '.join(sorted(unknown))}")
        spec = cls(name=name, **body)
        if (
            not isinstance(spec.replicas, int)
            or isinstance(spec.replicas, bool)
            or not 0 <= spec.replicas <= 64
        ):
            raise InvalidRequest("replicas must be an integer from 0 to 64")
        if spec.cpus is not None and (
            isinstance(spec.cpus, bool)
            or not isinstance(spec.cpus, int | float)
            or not 0.01 <= spec.cpus <= 1024
        ):
            raise InvalidRequest("cpus must be a number of cores from 0.01 to 1024")
        if (
            isinstance(spec.state_timeout, bool)
            or not isinstance(spec.state_timeout, int | float)
            or not 0 < spec.state_timeout <= 3600
        ):
            raise InvalidRequest("state_timeout must be a number of seconds from 0 to 3600")
        for attr in (
            "memory_mb",
            "cpu_seconds",
            "max_processes",
            "tmp_mb",
            "disk_mb",
            "state_max_mb",
        ):
            value = getattr(spec, attr)
            lifts = attr in LIFTABLE and value == 0
            if value is not None and (not isinstance(value, int) or value <= 0) and not lifts:
                raise InvalidRequest(
                    f"{attr} must be a positive integer"
                    + (" (or 0: no limit)" if attr in LIFTABLE else "")
                )
        if not isinstance(spec.kernel_name, str) or not spec.kernel_name:
            raise InvalidRequest("kernel_name must be a non-empty string")
        if not isinstance(spec.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in spec.env.items()
        ):
            raise InvalidRequest("env must be an object of strings")
        if spec.files not in FILES_MODES:
            raise InvalidRequest(f"files must be one of: {', '.join(FILES_MODES)}")
        spec.requirements = check_requirements(spec.requirements)
        for attr in ("network", "keep_workspace", "save_state", "pip_config"):
            if not isinstance(getattr(spec, attr), bool):
                raise InvalidRequest(f"{attr} must be true or false")
        return spec

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def tmp_bytes(self) -> int:
        """The private /tmp's size: ``tmp_mb``, else the memory limit, at most 1 GiB."""
        mb = self.tmp_mb or min(self.memory_mb or DEFAULT_TMP_MB, DEFAULT_TMP_MB)
        return mb * 1024 * 1024

    def cgroup_memory_bytes(self) -> int | None:
        """The memory cgroup's limit: ``memory_mb``, else the default; 0 lifts it."""
        if self.memory_mb == 0:
            return None
        return (self.memory_mb or default_memory_mb()) * 1024 * 1024

    def process_limit(self) -> int | None:
        """Processes and threads: ``max_processes``, else the default; 0 lifts it."""
        if self.max_processes == 0:
            return None
        return self.max_processes or DEFAULT_MAX_PROCESSES

    def disk_limit_bytes(self) -> int | None:
        """What a workspace may hold: ``disk_mb``, else the default; 0 lifts it."""
        if self.disk_mb == 0:
            return None
        return (self.disk_mb or DEFAULT_DISK_MB) * 1024 * 1024


# Limits a pool may lift with 0.
LIFTABLE = ("memory_mb", "max_processes", "disk_mb")


def default_memory_mb() -> int:
    """DEFAULT_MEMORY_MB, or half the machine's memory where that is less."""
    return min(DEFAULT_MEMORY_MB, psutil.virtual_memory().total // (2 * 1024 * 1024))


@dataclass
class Sandbox:
    """One sandbox: a workspace directory and, while Running, a runtime process."""

    name: str
    pool: str
    workspace: str
    runtime_dir: str
    owner: str  # "pool/<name>" or "claim/<name>"
    running: bool = True  # spec.operatingMode: Running (True) or Suspended (False)
    env: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    pid: int | None = None  # last known process, to reap it after a daemon crash
    saved_state: str = ""  # what the last suspend kept of the kernel's variables
    files_dir: str = ""  # the notebook's directory, bound at the same path ("": none)
    files_read_only: bool = False
    pool_packages: str = ""  # the pool's installed requirements it was started with
    disk_image: bool = False  # the workspace is an ext4 image of the pool's disk_mb
    # The notebook project's %pip packages, kept across its kernels ("": the workspace's)
    packages_dir: str = ""
    # Observed, not persisted as truth:
    ready: bool = False
    restarts: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Claim:
    name: str
    pool: str
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    owner_pid: int | None = None
    owner_start: float | None = None
    orphan_grace: float | None = None
    files_dir: str = ""  # the notebook's directory, checked ("": the kernel works in /workspace)
    sandbox: str | None = None
    warm: bool | None = None
    suspended: bool = False  # desired
    created: float = field(default_factory=time.time)
    ready_at: float | None = None
    phase: Phase = Phase.PENDING
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phase"] = str(self.phase)
        return data


class Store:
    """All objects in memory, written through to one JSON file so a daemon restart resumes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pools: dict[str, PoolSpec] = {}
        self.sandboxes: dict[str, Sandbox] = {}
        self.claims: dict[str, Claim] = {}

    def load(self) -> None:
        if not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.pools = {k: PoolSpec(**v) for k, v in data.get("pools", {}).items()}
        self.sandboxes = {k: Sandbox(**v) for k, v in data.get("sandboxes", {}).items()}
        claims = {}
        for key, value in data.get("claims", {}).items():
            value["phase"] = Phase(value.get("phase", "Pending"))
            claims[key] = Claim(**value)
        self.claims = claims

    def save(self) -> None:
        data = {
            "pools": {k: v.to_json() for k, v in self.pools.items()},
            "sandboxes": {k: v.to_json() for k, v in self.sandboxes.items()},
            "claims": {k: v.to_json() for k, v in self.claims.items()},
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)
