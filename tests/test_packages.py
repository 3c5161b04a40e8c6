"""%pip install in a sandboxed notebook: packages land in the workspace and stay across a suspend.

Offline on purpose: the package is a wheel next to the notebook, installed with
--no-index, so the test needs no package index.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import zipfile
from pathlib import Path

import pytest

from jupyter_sandbox.client import SandboxClient

from .helpers import KernelSocket, Server, jupyter_server, suspend_via_api

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


async def _kernel_in(server: Server, path: str) -> tuple[str, KernelSocket]:
    model = await server.request(
        "POST", "/api/kernels", {"name": "sandbox-default", "path": path}, expect=201
    )
    return model["id"], await KernelSocket(server, model["id"]).connect()


async def _imports(server: Server, path: str) -> str:
    """What a new kernel for the notebook at ``path`` says when it imports the package."""
    kernel_id, ws = await _kernel_in(server, path)
    try:
        result = await ws.execute(
            f"try:\n    import {PACKAGE}; print({PACKAGE}.VALUE, {PACKAGE}.__file__)\n"
            "except ImportError as exc:\n    print(type(exc).__name__)"
        )
        return result.stdout.strip()
    finally:
        ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_pip_packages_stay_with_the_project_across_kernels_and_restarts(
    tmp_path: Path, sandbox_home: Path
) -> None:
    """%pip went into the claim's workspace and vanished with the kernel: a 19 s
    reinstall after every shutdown or server restart. Now a project's packages are
    kept for it: its next kernels import them, another project's do not, and a
    kernel with no project (the SDK's, an agent's) starts clean."""
    root = tmp_path / "notebooks"
    (root / "analysis").mkdir(parents=True)
    (root / "other").mkdir()
    wheel = build_wheel(root / "analysis")
    with jupyter_server(tmp_path, root=root) as server:
        first, ws = await _kernel_in(server, "analysis/one.ipynb")
        second, ws2 = await _kernel_in(server, "analysis/two.ipynb")
        try:
            installed = await ws.execute(f"%pip install --no-index {wheel.name}", timeout=180)
            assert "Successfully installed" in installed.stdout, installed.stdout
            # a kernel of the same project that runs already sees it too
            beside = await ws2.execute(
                f"import importlib; importlib.invalidate_caches(); import {PACKAGE}; "
                f"print({PACKAGE}.VALUE)"
            )
            assert beside.stdout.strip() == "installed in the sandbox", beside.reply
        finally:
            ws.close()
            ws2.close()
        for kernel_id in (first, second):
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        again = await _imports(server, "analysis/three.ipynb")
        assert again.startswith("installed in the sandbox /workspace/.local/packages/"), again
        assert await _imports(server, "other/x.ipynb") == "ModuleNotFoundError"
    # The server restarted: the project's packages are still there.
    with jupyter_server(tmp_path, root=root) as server:
        after = await _imports(server, "analysis/four.ipynb")
        assert after.startswith("installed in the sandbox"), after
    with (
        SandboxClient() as client,
        client.create_sandbox("default", sandbox_ready_timeout=120) as sb,
    ):
        clean = sb.commands.run(f"python3 -c 'import {PACKAGE}'")
        assert "ModuleNotFoundError" in clean.stderr, clean
    if os.geteuid() == 0:  # as root the project's packages are an image of bounded size
        assert list((sandbox_home / "disks").glob("packages-*.ext4")), "an image per project"
