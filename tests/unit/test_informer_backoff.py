"""Found by the API-server outage test: while the restarted kube-apiserver was
still initialising its storage, watches answered 429 and the operator's
informers relisted at once, without any delay.  A watch that keeps failing with
an API error (429, 5xx, 403 after an RBAC change) while LIST works must back off
exponentially, not hammer the API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_sandbox.agent_sandbox import SANDBOX
from jupyter_sandbox.kube.client import ApiError
from jupyter_sandbox.kube.informer import Informer


class FlakyWatchClient:
    """LIST works; every WATCH fails with ``status`` (as a response or an ERROR event)."""

    def __init__(self, status: int, as_event: bool) -> None:
        self.status, self.as_event = status, as_event
        self.lists = 0

    async def list(self, res: Any, namespace: Any = None, **params: Any) -> dict:
        self.lists += 1
        await asyncio.sleep(0)  # a real LIST yields to the loop
        return {"items": [], "metadata": {"resourceVersion": str(self.lists)}}

    async def watch(self, *args: Any, **kwargs: Any):
        body = {"code": self.status, "reason": "TooManyRequests", "message": "storage is busy"}
        if self.as_event:
            yield {"type": "ERROR", "object": {"kind": "Status", **body}}
        raise ApiError(self.status, body, "WATCH", "/x")


@pytest.mark.parametrize(("status", "as_event"), [(429, False), (500, True), (403, False)])
async def test_failing_watch_backs_off(status, as_event):
    client = FlakyWatchClient(status, as_event)
    stop = asyncio.Event()
    task = asyncio.create_task(Informer(client, SANDBOX, "ns").run(stop))  # type: ignore[arg-type]
    await asyncio.sleep(2.0)
    stop.set()
    await asyncio.wait_for(task, 15)
    # 0.2 + 0.4 + 0.8 (+-20 %) s of back-off fit in 2 s: a handful of relists, not thousands
    print(f"\n[informer back-off] watch failing with {status}: {client.lists} LISTs in 2 s")
    assert 2 <= client.lists <= 6


async def test_gone_relists_at_once():
    client = FlakyWatchClient(410, as_event=True)
    stop = asyncio.Event()
    task = asyncio.create_task(Informer(client, SANDBOX, "ns").run(stop))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(task, 15)
    assert client.lists > 20  # 410 Gone: relist without waiting (client-go does the same)
