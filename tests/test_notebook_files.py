"""A sandboxed kernel works in its notebook's directory, and sees nothing else of the user's.

Driven as users drive it: a real Jupyter server started on a notebook directory
(JupyterLab passes the notebook's path), nbclient and papermill next to a CSV,
and code inside the sandbox that goes looking for the rest of the user's files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_sandbox.kernelspec import install_kernelspec

from .conftest import HOME, ROOT
from .helpers import KernelSocket, Server, apply_pool, claims_for, jupyter_server, suspend_via_api

pytestmark = pytest.mark.usefixtures("warm_daemon")


async def start_notebook_kernel(server: Server, path: str, name: str = "sandbox-default") -> str:
    model = await server.request("POST", "/api/kernels", {"name": name, "path": path}, expect=201)
    return str(model["id"])


def project(root: Path) -> Path:
    """A notebook directory with data next to it, and a sibling it must not see."""
    folder = root / "project"
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text("a,b\n1,2\n3,4\n")
    secret = root / "private"
    secret.mkdir()
    (secret / "keys.txt").write_text("not for the sandbox")
    return folder


@pytest.fixture
def home_secret() -> Iterator[Path]:
    """A file in the user's home directory, which no sandbox may see."""
    secret = Path.home() / ".jsbx-files-test-secret"
    secret.write_text("home secret")
    try:
        yield secret
    finally:
        secret.unlink()


async def test_a_notebook_kernel_works_in_the_notebook_directory(
    tmp_path: Path, home_secret: Path
) -> None:
    with jupyter_server(tmp_path) as server:
        folder = project(server.root)
        kernel_id = await start_notebook_kernel(server, "project/analysis.ipynb")
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(
                "import os, csv\n"
                "print(os.getcwd())\n"
                "rows = list(csv.reader(open('data.csv')))\n"
                "print(sum(int(r[1]) for r in rows[1:]))\n"
                "open('out.csv', 'w').write('total\\n6\\n')"
            )
            assert result.status == "ok", result.reply
            cwd, total = result.stdout.split()
            assert cwd == str(folder.resolve())
            assert total == "6"
            # The rest of the user's files are not there, whatever the path.
            probe = await ws.execute(
                "import os\n"
                f"print(os.path.exists({str(server.root / 'private')!r}),"
                " os.path.exists('../private/keys.txt'),"
                f" os.path.exists({str(HOME)!r}), os.path.exists({str(home_secret)!r}))"
            )
            assert probe.stdout.split() == ["False", "False", "False", "False"], probe.stdout
            [claim] = await claims_for(kernel_id)
            assert claim.resources.get("files_dir") == str(folder.resolve())
            # Suspend and resume: the directory is bound again for the new process.
            await suspend_via_api(server, kernel_id)
            again = await ws.execute("print(open('data.csv').read().count('\\n'))")
            assert "3" in again.stdout.splitlines(), again.stdout  # beside the resume notice
        finally:
            ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        assert (folder / "out.csv").read_text() == "total\n6\n", "outputs outlive the kernel"
        assert await claims_for(kernel_id) == []


async def test_a_symlink_planted_in_the_notebook_directory_leads_nowhere(
    tmp_path: Path, home_secret: Path
) -> None:
    with jupyter_server(tmp_path) as server:
        folder = project(server.root)
        (folder / "escape").symlink_to(server.root / "private")
        (folder / "home").symlink_to(home_secret)
        kernel_id = await start_notebook_kernel(server, "project/x.ipynb")
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(
                "import os\n"
                "for link in ('escape/keys.txt', 'home'):\n"
                "    try:\n"
                "        found = os.listdir(link) if os.path.isdir(link) else open(link).read()\n"
                "        print(link, found)\n"
                "    except OSError as exc:\n"
                "        print(link, type(exc).__name__)\n"
                "try:\n"
                "    os.symlink('/', 'root-link')\n"
                "    print('symlink made', os.listdir('root-link')[:3])\n"
                "except OSError as exc:\n"
                "    print('symlink', type(exc).__name__)\n"
            )
        finally:
            ws.close()
        lines = result.stdout.splitlines()
        assert lines[0] == "escape/keys.txt FileNotFoundError", lines
        assert lines[1] == "home FileNotFoundError", lines
        # A link the sandbox makes points into the sandbox's own root, not the host's.
        made = folder / "root-link"
        if made.is_symlink():
            assert os.readlink(made) == "/"
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_notebook_in_the_daemon_state_directory_is_refused_clearly(
    tmp_path: Path,
) -> None:
    with jupyter_server(tmp_path, root=ROOT) as server:
        response = await server.request(
            "POST",
            "/api/kernels",
            {"name": "sandbox-default", "path": "sandbox-home/workspaces/x.ipynb"},
        )
        # jupyter_server answers 500 with the provisioner's message; no claim is left.
        assert "state directory" in str(response), response
    assert [c for c in await claims_for() if c.labels.get("jupyter-sandbox/kernel-id")] == [], (
        "a refused claim leaves nothing behind"
    )


async def test_a_read_only_pool_shows_the_files_but_keeps_them(tmp_path: Path) -> None:
    await apply_pool("files-ro", {"replicas": 0, "files": "ro"})
    install_kernelspec("files-ro", prefix=str(ROOT))
    folder = project(tmp_path)
    try:
        nb = new_notebook(
            cells=[
                new_code_cell("print(open('data.csv').read().splitlines()[1])"),
                new_code_cell("open('out.csv', 'w')"),
            ]
        )
        NotebookClient(
            nb,
            kernel_name="sandbox-files-ro",
            allow_errors=True,
            timeout=120,
            resources={"metadata": {"path": str(folder)}},
        ).execute()
        assert nb.cells[0].outputs[0]["text"] == "1,2\n"
        assert nb.cells[1].outputs[0]["ename"] == "OSError"
        assert "Read-only file system" in nb.cells[1].outputs[0]["evalue"]
        assert not (folder / "out.csv").exists()
    finally:
        await apply_pool("files-ro", None)


async def test_a_pool_without_files_keeps_the_kernel_in_its_workspace(tmp_path: Path) -> None:
    await apply_pool("files-none", {"replicas": 1, "files": "none"})
    install_kernelspec("files-none", prefix=str(ROOT))
    folder = project(tmp_path)
    try:
        nb = new_notebook(cells=[new_code_cell("import os; print(os.getcwd())")])
        NotebookClient(
            nb,
            kernel_name="sandbox-files-none",
            timeout=120,
            resources={"metadata": {"path": str(folder)}},
        ).execute()
        assert nb.cells[0].outputs[0]["text"] == "/workspace\n"
    finally:
        await apply_pool("files-none", None)


def test_papermill_reads_inputs_and_keeps_outputs_next_to_the_notebook(tmp_path: Path) -> None:
    folder = project(tmp_path)
    nb = new_notebook(
        cells=[
            new_code_cell("name = 'result.txt'", metadata={"tags": ["parameters"]}),
            new_code_cell(
                "total = sum(int(l.split(',')[0]) for l in open('data.csv').readlines()[1:])\n"
                "open(name, 'w').write(str(total))"
            ),
        ]
    )
    nb.metadata["kernelspec"] = {
        "name": "sandbox-default",
        "display_name": "s",
        "language": "python",
    }
    source = folder / "job.ipynb"
    nbformat.write(nb, source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(source),
            str(folder / "job-out.ipynb"),
            "-p",
            "name",
            "sum.txt",
            "--cwd",
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (folder / "sum.txt").read_text() == "4"
