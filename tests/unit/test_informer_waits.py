"""The informer features the router and the backend's claim waits build on:
``wait_until``, ``transform`` and the field selector, against a scripted client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_sandbox.agent_sandbox import CLAIM
from jupyter_sandbox.kube.client import ApiError, Unreachable
from jupyter_sandbox.kube.informer import Informer


def claim(name: str, rv: int, ready: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
        "spec": {"big": "x" * 1000},
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


class ScriptedClient:
    """LIST answers ``items`` (or raises ``list_error``); WATCH replays the events
    put on ``events`` and then waits for more."""

    def __init__(self, items: list[dict], list_error: Exception | None = None) -> None:
        self.items = items
        self.list_error = list_error
        self.events: asyncio.Queue[dict] = asyncio.Queue()
        self.list_params: list[dict] = []
        self.watch_params: list[dict] = []

    async def list(self, res: Any, namespace: Any = None, **params: Any) -> dict:
        self.list_params.append(params)
        await asyncio.sleep(0)
        if self.list_error is not None:
            raise self.list_error
        return {"items": [dict(i) for i in self.items], "metadata": {"resourceVersion": "1"}}

    async def watch(self, res: Any, namespace: Any, rv: str, label_selector: Any, **kw: Any):
        self.watch_params.append(kw)
        while True:
            yield await self.events.get()


def ready_of(informer: Informer, name: str):
    def check():
        obj = informer.get("ns", name)
        if obj is None:
            return None
        return obj if obj["status"]["conditions"][0]["status"] == "True" else None

    return check


async def run(informer: Informer):
    stop = asyncio.Event()
    task = asyncio.create_task(informer.run(stop))
    return stop, task


async def finish(stop: asyncio.Event, task: asyncio.Task) -> None:
    stop.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_wait_until_returns_when_an_event_satisfies_it():
    client = ScriptedClient([claim("a", 1)])
    informer = Informer(client, CLAIM, "ns", field_selector="metadata.name=a")  # type: ignore[arg-type]
    stop, task = await run(informer)
    try:
        waiter = asyncio.create_task(informer.wait_until(ready_of(informer, "a"), 10))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # listed, not ready yet
        await client.events.put({"type": "MODIFIED", "object": claim("a", 2, ready=True)})
        got = await asyncio.wait_for(waiter, 5)
        assert got["metadata"]["resourceVersion"] == "2"
    finally:
        await finish(stop, task)
    # the selector reaches both the LIST and the WATCH
    assert client.list_params[0]["fieldSelector"] == "metadata.name=a"
    assert client.watch_params[0]["field_selector"] == "metadata.name=a"


async def test_wait_until_times_out():
    client = ScriptedClient([claim("a", 1)])
    informer = Informer(client, CLAIM, "ns")  # type: ignore[arg-type]
    stop, task = await run(informer)
    try:
        with pytest.raises(TimeoutError):
            await informer.wait_until(ready_of(informer, "a"), 0.2)
    finally:
        await finish(stop, task)


@pytest.mark.parametrize(
    "error", [ApiError(403, {"reason": "Forbidden"}), Unreachable("connection refused")]
)
async def test_a_failing_list_reaches_the_waiter(error):
    client = ScriptedClient([], list_error=error)
    informer = Informer(client, CLAIM, "ns")  # type: ignore[arg-type]

    def check():
        if informer.last_error is not None:
            raise informer.last_error
        return None

    stop, task = await run(informer)
    try:
        with pytest.raises(type(error)):
            await informer.wait_until(check, 5)
        assert not informer.synced.is_set()
    finally:
        await finish(stop, task)


async def test_transform_trims_listed_watched_and_written_objects():
    def trim(obj: dict) -> dict:
        return {"metadata": obj["metadata"], "status": obj["status"]}

    client = ScriptedClient([claim("a", 1)])
    informer = Informer(client, CLAIM, "ns", transform=trim)  # type: ignore[arg-type]
    stop, task = await run(informer)
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        assert "spec" not in informer.get("ns", "a")
        await client.events.put({"type": "ADDED", "object": claim("b", 2)})
        await informer.wait_until(lambda: informer.get("ns", "b"), 5)
        assert "spec" not in informer.get("ns", "b")
        informer.upsert_local(claim("c", 3))
        assert "spec" not in informer.get("ns", "c")
    finally:
        await finish(stop, task)


async def test_a_deleted_object_wakes_the_waiter():
    client = ScriptedClient([claim("a", 1)])
    informer = Informer(client, CLAIM, "ns")  # type: ignore[arg-type]

    def gone_or_ready():
        obj = informer.get("ns", "a")
        return "gone" if obj is None else ready_of(informer, "a")()

    stop, task = await run(informer)
    try:
        waiter = asyncio.create_task(informer.wait_until(gone_or_ready, 10))
        await asyncio.sleep(0.05)
        await client.events.put({"type": "DELETED", "object": claim("a", 2)})
        assert await asyncio.wait_for(waiter, 5) == "gone"
    finally:
        await finish(stop, task)
