"""Notebooks run in batch (nbclient, nbconvert, papermill) with the sandbox kernel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.usefixtures("warm_daemon")

CELLS = [
    "x = 21\nprint('stdout line')",
    "import sys\nprint('stderr line', file=sys.stderr)",
    "from IPython.display import HTML, Markdown, display\n"
    "display(HTML('<i>rich</i>'))\ndisplay(Markdown('**md**'))",
    "{'answer': x * 2}",
    "raise RuntimeError('expected failure')",
    "print('after the error')",
]


def notebook() -> nbformat.NotebookNode:
    return new_notebook(cells=[new_code_cell(src) for src in CELLS])


def run(kernel_name: str, cwd: Path) -> list[list[dict[str, Any]]]:
    nb = notebook()
    client = NotebookClient(
        nb,
        kernel_name=kernel_name,
        allow_errors=True,
        timeout=120,
        iopub_timeout=30,  # a loaded CI machine can lag behind the 4 s default
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return [cell["outputs"] for cell in nb.cells]


def test_nbclient_outputs_equal_plain_python(tmp_path: Path) -> None:
    sandboxed = run("sandbox-default", tmp_path)
    plain = run("python3", tmp_path)
    assert sandboxed == plain
    assert sandboxed[0][0]["text"] == "stdout line\n"
    assert sandboxed[2][0]["data"]["text/html"] == "<i>rich</i>"
    assert sandboxed[4][0]["ename"] == "RuntimeError"
    assert sandboxed[5][0]["text"] == "after the error\n"


def test_nbconvert_execute_cli(tmp_path: Path) -> None:
    source = tmp_path / "in.ipynb"
    nb = notebook()
    nb.cells = nb.cells[:4]
    nbformat.write(nb, source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--ExecutePreprocessor.kernel_name=sandbox-default",
            "--output",
            "out.ipynb",
            str(source),
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    out = json.loads((tmp_path / "out.ipynb").read_text())
    assert "".join(out["cells"][3]["outputs"][0]["data"]["text/plain"]) == "{'answer': 42}"


def test_papermill_with_parameters(tmp_path: Path) -> None:
    nb = new_notebook(
        cells=[
            new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
            new_code_cell("print(n * 10)"),
        ]
    )
    nb.metadata["kernelspec"] = {
        "name": "sandbox-default",
        "display_name": "sandbox",
        "language": "python",
    }
    source, target = tmp_path / "p.ipynb", tmp_path / "p-out.ipynb"
    nbformat.write(nb, source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(source),
            str(target),
            "-p",
            "n",
            "7",
            "-k",
            "sandbox-default",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    out = json.loads(target.read_text())
    texts = ["".join(o.get("text", "")) for c in out["cells"] for o in c.get("outputs", [])]
    assert "70\n" in texts
