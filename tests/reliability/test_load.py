"""Load: many notebooks at once through one router on the local backend."""

from __future__ import annotations

import asyncio
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_sandbox.control_plane.local.client import LocalControlPlane

from .test_faults import router_process

pytestmark = pytest.mark.usefixtures("warm_daemon")

NOTEBOOKS = 50
# Generous: what matters is that memory does not grow with the traffic it carried.
ROUTER_RSS_LIMIT_MB = 250


def notebook(index: int) -> nbformat.NotebookNode:
    return new_notebook(
        cells=[
            new_code_cell(f"n = {index}\nprint('notebook', n)"),
            new_code_cell("import hashlib\nprint(hashlib.sha256(str(n).encode()).hexdigest())"),
            new_code_cell("print('x' * 200_000)"),  # some bulk through the router
            new_code_cell("n * 2"),
        ]
    )


async def run_one(index: int) -> nbformat.NotebookNode:
    nb = notebook(index)
    # iopub_timeout: how long nbclient waits for the output that trails an execute_reply.
    # Its 4 s default is for an idle machine; 50 kernels on 2 cores can lag longer.
    client = NotebookClient(
        nb, kernel_name="sandbox-default", timeout=300, startup_timeout=300, iopub_timeout=120
    )
    await client.async_execute()
    return nb


async def test_fifty_notebooks_at_once_through_one_router() -> None:
    import hashlib

    router = router_process()
    before = router.memory_info().rss / 1e6
    started = time.monotonic()
    results = await asyncio.gather(*(run_one(i) for i in range(NOTEBOOKS)))
    elapsed = time.monotonic() - started
    for index, nb in enumerate(results):
        outputs = [cell.outputs for cell in nb.cells]
        assert outputs[0][0]["text"] == f"notebook {index}\n"
        assert outputs[1][0]["text"].strip() == hashlib.sha256(str(index).encode()).hexdigest()
        # ipykernel may flush one print as several stream messages when it is busy
        assert "".join(out["text"] for out in outputs[2]) == "x" * 200_000 + "\n"
        assert outputs[3][0]["data"]["text/plain"] == str(index * 2)
    after = router.memory_info().rss / 1e6
    print(f"\n{NOTEBOOKS} notebooks in {elapsed:.1f}s; router RSS {before:.0f} -> {after:.0f} MB")
    assert router_process().pid == router.pid, "the router must not have restarted"
    assert after < ROUTER_RSS_LIMIT_MB
    plane = LocalControlPlane()
    try:
        assert [c for c in await plane.list_claims() if c.pool == "default"] == []
    finally:
        await plane.close()
