"""Kernelspecs that select the sandbox provisioner for a pool."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

PROVISIONER_NAME = "sandbox-provisioner"
# How a kernel sees the notebook's directory (the provisioner's ``files`` option).
FILES_MODES = ("auto", "bind", "copy", "none")
NAME_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,40}[a-z0-9])?$")


def kernelspec_name(pool: str, backend: str = "local") -> str:
    return f"sandbox-{pool}" if backend == "local" else f"sandbox-{backend}-{pool}"


def make_kernelspec(
    pool: str,
    *,
    backend: str = "local",
    display_name: str | None = None,
    backend_options: dict[str, Any] | None = None,
    files: str = "auto",
) -> dict[str, Any]:
    if not NAME_RE.match(pool):
        raise ValueError(f"pool name {pool!r} is not valid (lower-case letters, digits, '-')")
    if backend not in ("local", "kubernetes"):
        raise ValueError(f"backend must be 'local' or 'kubernetes', not {backend!r}")
    if files not in FILES_MODES:
        raise ValueError(f"files must be one of {', '.join(FILES_MODES)}, not {files!r}")
    if files == "bind" and backend != "local":
        raise ValueError("files 'bind' needs the local backend; use 'copy' on Kubernetes")
    config: dict[str, Any] = {"pool": pool, "backend": backend}
    if files != "auto":
        config["files"] = files
    if backend_options:
        config["backend_options"] = backend_options
    where = "sandbox" if backend == "local" else "k8s sandbox"
    # Two kernelspecs of one pool that see the files differently must not look alike.
    how = "" if files == "auto" else f", files: {files}"
    return {
        # argv is what runs inside the sandbox's runtime; the provisioner never runs it here.
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name or f"Python 3 ({where}: {pool}{how})",
        "language": "python",
        "interrupt_mode": "message",
        "env": {},
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": config},
            "jupyter_sandbox": {"pool": pool, "backend": backend},
        },
    }


def install_kernelspec(
    pool: str,
    *,
    backend: str = "local",
    display_name: str | None = None,
    backend_options: dict[str, Any] | None = None,
    user: bool = False,
    prefix: str | None = None,
    name: str | None = None,
    files: str = "auto",
) -> str:
    """Write the kernelspec (with the sandbox logo) and return where it went."""
    spec = make_kernelspec(
        pool,
        backend=backend,
        display_name=display_name,
        backend_options=backend_options,
        files=files,
    )
    name = name or kernelspec_name(pool, backend)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
        logos = resources.files("jupyter_sandbox") / "resources"
        for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
            source = logos / logo
            if source.is_file():
                with resources.as_file(source) as path:
                    shutil.copy(path, folder / logo)
        if prefix is None and not user:
            prefix = sys.prefix
        return KernelSpecManager().install_kernel_spec(
            str(folder), kernel_name=name, user=user, prefix=prefix
        )
