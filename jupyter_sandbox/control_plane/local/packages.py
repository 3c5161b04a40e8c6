"""Packages for a pool's sandboxes: the pool's own requirements and the host's pip index.

A pool may declare requirement lines (like an E2B template). The daemon installs
them once per pool, on the host, with the Python the sandboxes use, into a
directory of the pool's under the state directory; every sandbox of the pool gets
that directory read-only, after its own ``.local/packages`` on the path.

``%pip install`` inside a sandbox uses the index the user's pip on the host uses:
the index URLs, trusted hosts and CA bundle are forwarded, never credentials.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..base import InvalidRequest

log = logging.getLogger(__name__)

MAX_LINES = 500
MAX_LINE_CHARS = 4096
MAX_TOTAL_CHARS = 64 * 1024

# Requirement-file options that only choose where packages come from.
SOURCE_OPTIONS = {
    "-i": "--index-url",
    "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "--no-index": "--no-index",
    "-f": "--find-links",
    "--find-links": "--find-links",
    "--trusted-host": "--trusted-host",
    "--pre": "--pre",
    "--prefer-binary": "--prefer-binary",
    "--only-binary": "--only-binary",
    "--no-binary": "--no-binary",
    "--require-hashes": "--require-hashes",
}
# The source options above that take a value.
VALUE_OPTIONS = {
    "--index-url",
    "--extra-index-url",
    "--find-links",
    "--trusted-host",
    "--only-binary",
    "--no-binary",
}
# Options that would read or write files outside the pool's environment.
REFUSED_OPTIONS = {
    "-e": "an editable install links to a directory of the host",
    "--editable": "an editable install links to a directory of the host",
    "-r": "a nested requirements file is a path on the host; list its lines instead",
    "--requirement": "a nested requirements file is a path on the host; list its lines instead",
    "-c": "a constraints file is a path on the host; list its lines instead",
    "--constraint": "a constraints file is a path on the host; list its lines instead",
    "-t": "the daemon chooses where the pool's packages go",
    "--target": "the daemon chooses where the pool's packages go",
    "--prefix": "the daemon chooses where the pool's packages go",
    "--root": "the daemon chooses where the pool's packages go",
    "--user": "the daemon chooses where the pool's packages go",
    "--src": "the daemon chooses where the pool's packages go",
}
# Options allowed after a requirement on its own line.
PER_REQUIREMENT_OPTIONS = {"--hash"}
ENV_REFERENCE = re.compile(r"\$\{[A-Z0-9_]+\}")


def check_requirements(lines: Any) -> list[str]:
    """Requirement lines a pool may declare, stripped; InvalidRequest says what is wrong."""
    if lines is None:
        return []
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise InvalidRequest("requirements must be a list of strings (requirement lines)")
    if len(lines) > MAX_LINES:
        raise InvalidRequest(f"requirements may have at most {MAX_LINES} lines")
    if sum(len(line) for line in lines) > MAX_TOTAL_CHARS:
        raise InvalidRequest(f"requirements may have at most {MAX_TOTAL_CHARS} characters")
    kept = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        problem = _line_problem(line)
        if problem:
            raise InvalidRequest(
                f"requirement line {line[:200]!r} is not allowed: {problem}",
                hint="a pool's requirements may name packages, versions, URLs and "
                "--index-url/--extra-index-url/--find-links/--no-index/--trusted-host",
            )
        kept.append(line)
    return kept


def _line_problem(line: str) -> str:
    if len(line) > MAX_LINE_CHARS:
        return f"longer than {MAX_LINE_CHARS} characters"
    if any(ch in line for ch in "\n\r\0"):
        return "a line may not contain line breaks or NUL"
    if line.endswith("\\"):
        return "continuation lines are not supported"
    if ENV_REFERENCE.search(line):
        return "environment variables are not expanded in a pool's requirements"
    words = line.split()
    if line.startswith("-"):
        return _options_problem(words)
    if line.startswith("."):
        return "a relative path means nothing to the daemon; use an absolute path or --find-links"
    for word in words[1:]:
        if word.startswith("-") and _option_name(word) not in PER_REQUIREMENT_OPTIONS:
            return f"option {_option_name(word)} is not supported here"
    return ""


def _options_problem(words: list[str]) -> str:
    """Every option on an option line, not the first only (``--pre -r ~/.ssh/id_rsa``
    was accepted, and pip printed the key's first line into the pool's log)."""
    expect_value = False
    for word in words:
        if expect_value:
            expect_value = False
            continue
        if not word.startswith("-"):
            return f"{word[:100]!r} is neither an option nor an option's value"
        name = _option_name(word)
        if name in REFUSED_OPTIONS:
            return REFUSED_OPTIONS[name]
        if name not in SOURCE_OPTIONS:
            return f"option {name} is not supported here"
        attached = "=" in word if word.startswith("--") else len(word) > 2
        expect_value = SOURCE_OPTIONS[name] in VALUE_OPTIONS and not attached
    return ""


def _option_name(word: str) -> str:
    """``--target=/x`` -> ``--target``; ``-t/x`` and ``-e.`` -> ``-t``, ``-e``."""
    if word.startswith("--"):
        return word.split("=", 1)[0]
    return word[:2]


def requirements_hash(lines: list[str]) -> str:
    """What an installed pool environment was built from (the lines and the Python)."""
    data = json.dumps({"lines": lines, "python": sys.version, "executable": sys.executable})
    return hashlib.sha256(data.encode()).hexdigest()[:16]


# -- the host's pip configuration -------------------------------------------------

FORWARDED_URL_KEYS = ("index-url", "extra-index-url")
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
MAX_CA_BYTES = 16 * 1024 * 1024


@dataclass
class PipForwarding:
    """What of the host's pip configuration reaches a sandbox."""

    env: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # CA bundles, bound read-only
    dropped: list[str] = field(default_factory=list)  # what was not forwarded, and why


def has_credentials(url: str) -> bool:
    """Whether a URL may carry something secret: user info, a query string, or a path
    segment that looks like a token (``https://host/s3cr3tT0k3n/simple``, the way
    some hosted indexes put one): letters and digits mixed in 8 characters or more.

    A plain index path (``/simple``, ``/api/pypi/pypi-remote/simple``,
    ``/root/pypi/+simple``) is not; a path we cannot tell from a token is treated as
    one, since the cost of a wrong guess is a pool's index set by hand, not a leak.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return True
    if "@" in parts.netloc or parts.query or parts.fragment:
        return True
    return any(_token_like(segment) for segment in unquote(parts.path).split("/"))


def _token_like(segment: str) -> bool:
    letters = any(c.isalpha() for c in segment)
    digits = any(c.isdigit() for c in segment)
    return len(segment) >= 8 and letters and digits


def _redacted(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.netloc.rpartition("@")[2]
    user = "***@" if "@" in parts.netloc else ""
    path = "/".join("***" if _token_like(unquote(s)) else s for s in parts.path.split("/"))
    query = "?***" if parts.query or parts.fragment else ""
    return f"{parts.scheme}://{user}{host}{path}{query}"


def effective_settings(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """pip's configuration items (``section.key``) as pip's install command sees them:
    the environment over ``[install]`` over ``[global]``; later files override earlier."""
    ranked: dict[str, tuple[int, str]] = {}
    rank = {"global": 0, "install": 1, ":env:": 2}
    for key, value in items:
        section, _, name = key.partition(".")
        if section not in rank:
            continue
        current = ranked.get(name)
        if current is None or current[0] <= rank[section]:
            ranked[name] = (rank[section], value)
    return {name: value for name, (_, value) in ranked.items()}


def forwarding(
    settings: Mapping[str, str],
    environ: Mapping[str, str],
    state_dir: str | None = None,
) -> PipForwarding:
    """The PIP_* variables and CA files a sandbox gets from the host's pip settings."""
    result = PipForwarding()
    index = settings.get("index-url", "").strip()
    if index:
        if _forwardable(index, "index-url", result):
            result.env["PIP_INDEX_URL"] = index
    extras = [
        url
        for url in settings.get("extra-index-url", "").split()
        if _forwardable(url, "extra-index-url", result)
    ]
    if extras:
        result.env["PIP_EXTRA_INDEX_URL"] = " ".join(extras)
    hosts = [h for h in settings.get("trusted-host", "").split() if "@" not in h and "/" not in h]
    if hosts:
        result.env["PIP_TRUSTED_HOST"] = " ".join(hosts)
    candidates = [("PIP_CERT", settings.get("cert", ""))]
    candidates += [(name, environ.get(name, "")) for name in CA_ENV]
    for name, path in candidates:
        path = path.strip()
        if not path:
            continue
        problem = _ca_problem(path, state_dir)
        if problem:
            result.dropped.append(f"{name}={path}: {problem}")
            continue
        result.env[name] = path
        if path not in result.files:
            result.files.append(path)
    return result


def _forwardable(url: str, key: str, result: PipForwarding) -> bool:
    if has_credentials(url):
        result.dropped.append(
            f"{key} {_redacted(url)}: it carries credentials (or a path that may be "
            "a token), and a secret must never reach the untrusted code in a sandbox; "
            "give a pool an index URL that is safe to share in its requirements"
        )
        return False
    if urlsplit(url).scheme not in ("http", "https"):
        result.dropped.append(f"{key} {url}: only http(s) indexes are reachable from a sandbox")
        return False
    return True


def _ca_problem(path: str, state_dir: str | None) -> str:
    if not os.path.isabs(path):
        return "not an absolute path"
    real = os.path.realpath(path)
    if real.startswith(("/proc/", "/sys/", "/dev/")):
        return "not a regular file"
    if state_dir is not None:
        state = os.path.realpath(state_dir)
        if real == state or real.startswith(state.rstrip(os.sep) + os.sep):
            return "it is inside the sandbox daemon's state directory"
    try:
        info = os.stat(real)
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_size > MAX_CA_BYTES:
        return "larger than a CA bundle should be"
    return ""


def host_pip_settings() -> dict[str, str]:
    """The host pip's effective settings for ``pip install`` (files and PIP_* variables)."""
    try:
        from pip._internal.configuration import Configuration

        config = Configuration(isolated=False)
        config.load()
        items: list[tuple[str, str]] = []
        for key, value in config.items():
            if isinstance(value, dict):  # newer pip: one dictionary per file
                items += [(k, str(v)) for k, v in value.items()]
            else:
                items.append((key, str(value)))
    except Exception as exc:  # pip missing, or its internals changed
        log.warning("cannot read pip's configuration (%s); using PIP_* variables only", exc)
        items = [
            (":env:." + name[4:].lower().replace("_", "-"), value)
            for name, value in os.environ.items()
            if name.startswith("PIP_")
        ]
    return effective_settings(items)


def host_forwarding(state_dir: str | None = None) -> PipForwarding:
    """What of this host's pip configuration sandboxes get; says in the log what it drops."""
    result = forwarding(host_pip_settings(), os.environ, state_dir)
    for reason in result.dropped:
        log.warning("not forwarding pip setting to sandboxes: %s", reason)
    if result.env:
        log.info("forwarding pip settings to sandboxes: %s", ", ".join(sorted(result.env)))
    return result


# -- installing a pool's environment ---------------------------------------------

INSTALL_TIMEOUT = 1800.0
TAIL_LINES = 12
# pip settings of the daemon that would fight --target.
UNSET_FOR_INSTALL = ("PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PIP_SRC")
INSTALLING_PREFIX = ".installing-"

INSTALLING = "installing"
READY = "ready"
FAILED = "failed"


class InstallFailed(Exception):
    """pip did not install a pool's requirements; the message ends with pip's last lines."""


@dataclass
class PoolEnvironment:
    """One pool's package directory: which requirements, and how its install went."""

    digest: str
    path: Path  # <state>/pools/<pool>/<digest>, present once installed
    phase: str = INSTALLING
    message: str = ""
    task: asyncio.Task[None] | None = None
    staging: Path | None = None  # the temporary directory pip installs into


async def install(lines: list[str], env: PoolEnvironment, log_path: Path) -> None:
    """Install ``lines`` into a temporary directory beside ``env.path``, then rename it
    there: the final directory exists only complete. Raises InstallFailed."""
    parent = env.path.parent
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=f"{INSTALLING_PREFIX}{env.digest}-", dir=parent))
    env.staging = staging
    requirements = staging.with_suffix(".txt")
    requirements.write_text("\n".join(lines) + "\n")
    child_env = {k: v for k, v in os.environ.items() if k not in UNSET_FOR_INSTALL}
    child_env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-user",
        "--target",
        str(staging),
        "-r",
        str(requirements),
    ]
    try:
        with open(log_path, "wb") as handle:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=handle,
                stderr=asyncio.subprocess.STDOUT,
                env=child_env,
                cwd=str(parent),
                start_new_session=True,
                # readable by every sandbox: a root daemon's run as another host uid
                umask=0o022,
            )
            try:
                code = await asyncio.wait_for(proc.wait(), INSTALL_TIMEOUT)
            except BaseException:  # timeout, or the pool changed or went away
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # pip and the builds it started
                except ProcessLookupError:
                    pass
                await proc.wait()
                raise
        if code != 0:
            raise InstallFailed(f"pip exited with {code}: {tail(log_path)}")
        staging.chmod(0o755)  # (mkdtemp made it 0700) the sandboxes' view of it, read-only
        os.rename(staging, env.path)
    except TimeoutError:
        raise InstallFailed(
            f"pip did not finish in {INSTALL_TIMEOUT:g}s: {tail(log_path)}"
        ) from None
    finally:
        requirements.unlink(missing_ok=True)
        if staging.exists():
            await asyncio.to_thread(shutil.rmtree, staging, True)
        env.staging = None


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """pip's last lines of output, for a message (see the log for everything)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return "no output"
    kept = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-2000:] or "no output"
