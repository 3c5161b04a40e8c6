"""%pip install in a sandboxed notebook: packages land in the workspace and stay across a suspend.

Offline on purpose: the package is a wheel next to the notebook, installed with
--no-index, so the test needs no package index.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import zipfile
from pathlib import Path

import pytest

from .helpers import KernelSocket, jupyter_server, suspend_via_api

pytestmark = pytest.mark.usefixtures("warm_daemon")

PACKAGE = "jsbx_tiny_pkg"


def build_wheel(
    folder: Path, version: str = "1.0", value: str = "installed in the sandbox"
) -> Path:
    """A minimal pure-Python wheel, written by hand."""
    info = f"{PACKAGE}-{version}.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n".encode()
        ),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    wheel = folder / f"{PACKAGE}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


async def test_pip_install_then_suspend_then_import(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        folder = server.root / "project"
        folder.mkdir()
        wheel = build_wheel(folder)
        model = await server.request(
            "POST",
            "/api/kernels",
            {"name": "sandbox-default", "path": "project/nb.ipynb"},
            expect=201,
        )
        kernel_id = model["id"]
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            installed = await ws.execute(f"%pip install --no-index {wheel.name}", timeout=180)
            assert installed.status == "ok", installed.reply
            assert "Successfully installed" in installed.stdout, installed.stdout
            used = await ws.execute(f"import {PACKAGE}; print({PACKAGE}.VALUE, {PACKAGE}.__file__)")
            value, where = used.stdout.rsplit(" ", 1)
            assert value == "installed in the sandbox"
            assert where.startswith("/workspace/"), where
            await suspend_via_api(server, kernel_id)
            after = await ws.execute(
                f"import importlib; print(importlib.import_module({PACKAGE!r}).VALUE)"
            )
            # (the resume notice shares stdout with the cell's output)
            assert "installed in the sandbox" in after.stdout.splitlines(), (
                after.stdout,
                after.outputs,
            )
        finally:
            ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert importlib.util.find_spec(PACKAGE) is None, "the host's environment is untouched"
