"""Copy mode: the notebook's directory is copied into the sandbox, the kernel's changes back.

This is how a sandbox that cannot mount the user's files (a Kubernetes pod) sees
them; here it runs on the local backend with a kernelspec that asks for a copy.
Driven as users drive it (a real Jupyter server, nbclient), and attacked from
inside the sandbox: whatever the kernel writes comes back only as plain files in
the notebook's directory, never hidden ones, never through links, never executable.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_sandbox.kernelspec import install_kernelspec

from .conftest import ROOT
from .helpers import Server, claims_for, jupyter_server, kernel_socket, suspend_via_api

pytestmark = pytest.mark.usefixtures("warm_daemon")

KERNEL = "sandbox-copy"


@pytest.fixture(scope="module", autouse=True)
def copy_kernelspec() -> None:
    install_kernelspec("default", prefix=str(ROOT), name=KERNEL, files="copy")


def project(root: Path) -> Path:
    folder = root / "project"
    (folder / "sub").mkdir(parents=True)
    (folder / "data.csv").write_text("a,b\n1,2\n3,4\n")
    (folder / "sub" / "notes.txt").write_text("sub notes")
    (folder / ".env").write_text("TOKEN=hidden-from-the-sandbox")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]")
    (root / "outside.txt").write_text("outside secret")
    (folder / "link.txt").symlink_to(root / "outside.txt")
    return folder


async def copy_back(server: Server, kernel_id: str) -> dict:
    model = await server.request("POST", f"/api/sandbox/kernels/{kernel_id}/copy-back", expect=200)
    return dict(model["sandbox"]["files"]["last"])


async def test_inputs_are_copied_in_and_outputs_come_back_at_shutdown(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        folder = project(server.root)
        async with kernel_socket(server, KERNEL, "project/analysis.ipynb") as (kernel_id, ws):
            [claim] = await claims_for(kernel_id)
            assert claim.warm, "copy mode keeps warm claims warm"
            assert not claim.resources.get("files_dir"), "nothing of the host is mounted"
            result = await ws.execute(
                "import os, csv\n"
                "rows = list(csv.reader(open('data.csv')))\n"
                "print(sum(int(r[1]) for r in rows[1:]), open('sub/notes.txt').read())\n"
                "print(sorted(n for n in os.listdir('.') if not n.startswith('.sandbox')))\n"
                "open('out.csv', 'w').write('total\\n6\\n')\n"
                "os.makedirs('results/plots', exist_ok=True)\n"
                "open('results/plots/p.txt', 'w').write('plot')\n"
                "open('run.sh', 'w').write('#!/bin/sh\\necho hi\\n'); os.chmod('run.sh', 0o755)\n"
            )
            assert result.status == "ok", result.reply
            first, listing = result.stdout.splitlines()
            assert first == "6 sub notes"
            # Hidden entries and symlinks stayed out; the rest came in.
            for name in ("data.csv", "sub"):
                assert f"'{name}'" in listing, listing
            for name in (".env", ".git", "link.txt"):
                assert f"'{name}'" not in listing, listing
            model = await server.request("GET", f"/api/sandbox/kernels/{kernel_id}")
            files = model["sandbox"]["files"]
            assert files["mode"] == "copy" and files["dir"] == str(folder.resolve())
            assert "2 file(s) copied into the sandbox" in files["copied_in"], files
            assert "link.txt (a symlink)" in files["copied_in"], files
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        assert (folder / "out.csv").read_text() == "total\n6\n", "outputs outlive the kernel"
        assert (folder / "results" / "plots" / "p.txt").read_text() == "plot"
        mode = (folder / "run.sh").stat().st_mode
        assert not mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH), oct(mode)
        assert (folder / "data.csv").read_text() == "a,b\n1,2\n3,4\n"
        assert await claims_for(kernel_id) == []


async def test_a_file_changed_on_both_sides_is_kept_twice(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        folder = project(server.root)
        async with kernel_socket(server, KERNEL, "project/x.ipynb") as (kernel_id, ws):
            (folder / "data.csv").write_text("edited on the host\n")
            result = await ws.execute(
                "open('data.csv', 'w').write('edited in the sandbox\\n')\n"
                "open('sub/notes.txt', 'a').write(' + more')\n"
            )
            assert result.status == "ok", result.reply
            report = await copy_back(server, kernel_id)
        assert report["conflicts"] == [
            {"path": "data.csv", "written_as": "data.from-sandbox.csv"}
        ], report
        assert report["copied"] == ["sub/notes.txt"], report
        assert (folder / "data.csv").read_text() == "edited on the host\n", "nothing lost"
        assert (folder / "data.from-sandbox.csv").read_text() == "edited in the sandbox\n"
        assert (folder / "sub" / "notes.txt").read_text() == "sub notes + more"
        # Asked again with nothing new: nothing is copied twice.
        again = await copy_back(server, kernel_id)
        assert again["copied"] == [] and again["conflicts"] == [], again
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_what_a_kernel_plants_does_not_reach_the_host(tmp_path: Path) -> None:
    """Hooks, profiles, links and traversal names written inside stay inside."""
    with jupyter_server(tmp_path) as server:
        folder = project(server.root)
        async with kernel_socket(server, KERNEL, "project/x.ipynb") as (kernel_id, ws):
            result = await ws.execute(
                "import os\n"
                "os.makedirs('.git/hooks', exist_ok=True)\n"
                "open('.git/hooks/post-checkout', 'w').write('#!/bin/sh\\ncurl evil')\n"
                "open('.bashrc', 'w').write('curl evil')\n"
                "os.symlink('/etc/passwd', 'passwd-link')\n"
                "os.symlink('/', 'root-link')\n"
                "os.makedirs('__pycache__', exist_ok=True)\n"
                "open('__pycache__/x.pyc', 'wb').write(b'x')\n"
                "open('fine.txt', 'w').write('fine')\n"
            )
            assert result.status == "ok", result.reply
            report = await copy_back(server, kernel_id)
        assert report["copied"] == ["fine.txt"], report
        assert not (folder / ".git" / "hooks").exists()
        assert not (folder / ".bashrc").exists()
        assert not (folder / "__pycache__").exists()
        for link in ("passwd-link", "root-link"):
            assert not (folder / link).exists(), link
        skipped = {s["path"] for s in report["skipped"]}
        assert "passwd-link" in skipped, report
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_suspend_copies_the_files_back(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        folder = project(server.root)
        async with kernel_socket(server, KERNEL, "project/x.ipynb") as (kernel_id, ws):
            await ws.execute("open('before-cull.txt', 'w').write('kept')")
            await suspend_via_api(server, kernel_id)
            assert (folder / "before-cull.txt").read_text() == "kept"
            # Suspended: nothing to copy now, and the answer says why.
            response = await server.request(
                "POST", f"/api/sandbox/kernels/{kernel_id}/copy-back", expect=409
            )
            assert "suspended" in response["message"], response
            again = await ws.execute("print(open('before-cull.txt').read())")
            assert "kept" in again.stdout, again.stdout
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_kernel_that_mounts_its_directory_has_nothing_to_copy(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        project(server.root)
        model = await server.request(
            "POST", "/api/kernels", {"name": "sandbox-default", "path": "project/x.ipynb"}
        )
        kernel_id = model["id"]
        response = await server.request(
            "POST", f"/api/sandbox/kernels/{kernel_id}/copy-back", expect=409
        )
        assert "no copy" in response["message"], response
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_nbclient_reads_its_input_and_keeps_its_output(tmp_path: Path) -> None:
    folder = project(tmp_path)
    nb = new_notebook(
        cells=[
            new_code_cell("print(open('data.csv').read().splitlines()[1])"),
            new_code_cell("open('result.txt', 'w').write('from a batch run')"),
        ]
    )
    NotebookClient(
        nb, kernel_name=KERNEL, timeout=120, resources={"metadata": {"path": str(folder)}}
    ).execute()
    assert nb.cells[0].outputs[0]["text"] == "1,2\n"
    assert (folder / "result.txt").read_text() == "from a batch run"
