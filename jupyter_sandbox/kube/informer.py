"""List+watch caches of one resource type: the informer of client-go, in asyncio.

``Informer.run`` LISTs (in pages) and then WATCHes from the list's
resourceVersion, with bookmarks; a 410 relists at once, any other failure
relists after an exponential backoff.  Handlers get ``(old, new)`` for every
change (``new`` None for a deletion); ``wait_until`` lets a coroutine wait for
the cache to reach a state.  Used by the operator's reconcilers, the router's
sandbox resolver and the backend's claim waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TypeVar

from prometheus_client import Counter

from ..agent_sandbox import Resource
from .client import ApiError, Client, Unreachable, sleep_or_stop

log = logging.getLogger("jupyter_sandbox.kube")

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name)
Handler = Callable[[dict | None, dict | None], None]  # (old, new); new None = deleted
MAX_TOMBSTONES = 10_000

WATCH_RESTARTS = Counter(
    "jupyter_sandbox_operator_watch_restarts_total", "Watch (re)starts", ["resource"]
)


def _rv(obj: dict) -> int:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return 0


def key_of(obj: dict) -> Key:
    md = obj["metadata"]
    return md.get("namespace", ""), md["name"]


class Informer:
    """List+watch cache of one resource type, with indexers and event handlers."""

    def __init__(
        self,
        client: Client,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        indexers: dict[str, Callable[[dict], Iterable[str]]] | None = None,
        *,
        field_selector: str | None = None,
        transform: Callable[[dict], dict] | None = None,
        page_size: int = 500,
    ) -> None:
        """``transform`` trims each object before it is cached (client-go's
        SetTransform): a cache that needs a few fields need not hold whole objects.
        It must keep ``metadata.name``, ``namespace`` and ``resourceVersion``."""
        self.client = client
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.transform = transform
        self.page_size = page_size
        self.store: dict[Key, dict] = {}
        self.handlers: list[Handler] = []
        self.indexers = indexers or {}
        self.indices: dict[str, dict[str, set[Key]]] = {n: {} for n in self.indexers}
        # Keys deleted lately, with the resourceVersion they were gone at: the answer
        # to one of our own writes that arrives after the delete must not bring the
        # object back into the cache (a zombie the reconcilers would act on).
        self._tombstones: OrderedDict[Key, int] = OrderedDict()
        self.synced = asyncio.Event()
        # The failure that keeps the cache from (re)syncing, None while it works.
        self.last_error: Exception | None = None
        self._waiters: list[asyncio.Future[None]] = []

    def add_handler(self, h: Handler) -> None:
        self.handlers.append(h)

    def get(self, namespace: str, name: str) -> dict | None:
        return self.store.get((namespace, name))

    def by_index(self, index: str, value: str) -> list[dict]:
        return [self.store[k] for k in self.indices[index].get(value, ()) if k in self.store]

    def items(self) -> list[dict]:
        return list(self.store.values())

    def _index(self, k: Key, old: dict | None, new: dict | None) -> None:
        for name, fn in self.indexers.items():
            idx = self.indices[name]
            if old is not None:
                for v in fn(old):
                    s = idx.get(v)
                    if s:
                        s.discard(k)
                        if not s:
                            del idx[v]
            if new is not None:
                for v in fn(new):
                    idx.setdefault(v, set()).add(k)

    def _apply(self, etype: str, obj: dict, *, gone_at: int | None = None) -> None:
        k = key_of(obj)
        old = self.store.get(k)
        if etype == "DELETED":
            self.store.pop(k, None)
            self._bury(k, _rv(obj) if gone_at is None else gone_at)
            self._index(k, old, None)
            new = None
            if old is None:
                old = obj
        else:
            # our own writes are put into the cache at once (upsert_local); a watch
            # event older than what we hold must not roll the cache back
            if old is not None and _rv(old) > _rv(obj):
                return
            self._tombstones.pop(k, None)
            self.store[k] = obj
            self._index(k, old, obj)
            new = obj
        for h in self.handlers:
            try:
                h(old, new)
            except Exception:  # pragma: no cover - handler bugs must not kill the watch
                log.exception("informer handler failed", extra={"resource": self.res.plural})
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_until(self, check: Callable[[], T | None], timeout: float) -> T:
        """Wait until ``check()`` returns something other than None, and return it.

        ``check`` runs once the cache has synced and again after every change and
        every failure of the list/watch (``last_error``), so it may raise to end
        the wait.  Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.synced.is_set() or self.last_error is not None:
                result = check()
                if result is not None:
                    return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass

    def upsert_local(self, obj: dict) -> None:
        """Write-through after our own successful write (read-your-writes for reconcilers)."""
        obj = self._trim(obj)
        k = key_of(obj)
        old = self.store.get(k)
        if old is not None and _rv(old) >= _rv(obj):
            return
        if old is None and self._tombstones.get(k, -1) >= _rv(obj):
            return  # deleted since we wrote it
        self._apply("MODIFIED", obj)

    def _bury(self, k: Key, rv: int) -> None:
        self._tombstones[k] = max(rv, self._tombstones.get(k, rv))
        self._tombstones.move_to_end(k)
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)

    async def patch_status(self, obj: dict, status: dict) -> None:
        """Merge-patch ``obj``'s status subresource and cache the result; an object
        deleted meanwhile needs no status."""
        try:
            updated = await self.client.patch(
                self.res,
                obj["metadata"]["namespace"],
                obj["metadata"]["name"],
                {"status": status},
                sub="status",
            )
        except ApiError as e:
            if not e.not_found:
                raise
            return
        self.upsert_local(updated)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Informer]:
        """Run the informer for the duration of a ``with`` block."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name=f"informer {self.res.plural}")
        try:
            yield self
        finally:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.2
        while not stop.is_set():
            try:
                rv = await self._relist()
                self.last_error = None
                self.synced.set()
                self._wake()
                while not stop.is_set():
                    WATCH_RESTARTS.labels(self.res.plural).inc()
                    async for ev in self.client.watch(
                        self.res,
                        self.namespace,
                        rv,
                        self.label_selector,
                        field_selector=self.field_selector,
                    ):
                        et = ev.get("type")
                        obj = ev.get("object", {})
                        if et == "ERROR":
                            if obj.get("code") == 410:
                                raise ApiError(410, obj, "WATCH", self.res.plural)
                            raise ApiError(
                                int(obj.get("code") or 500), obj, "WATCH", self.res.plural
                            )
                        backoff = 0.2  # the watch works: the next failure starts over
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if et == "BOOKMARK":
                            continue
                        self._apply(str(et), self._trim(obj))
                        if stop.is_set():
                            break
                    backoff = 0.2  # ended cleanly (server-side timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # API error or network trouble: relist after a pause
                if isinstance(e, ApiError) and e.gone:
                    continue  # resourceVersion too old: relist at once
                # a LIST that works with a WATCH that keeps failing (429 while the API
                # server initialises, 5xx, 403) must back off too, not relist in a loop
                err = str(e) if isinstance(e, ApiError | Unreachable) else repr(e)
                log.warning("watch failed", extra={"resource": self.res.plural, "error": err})
                self.last_error = e
                self._wake()
                if await sleep_or_stop(stop, backoff):
                    return
                backoff = min(backoff * 2, 10)

    def _trim(self, obj: dict) -> dict:
        return self.transform(obj) if self.transform is not None else obj

    async def _relist(self) -> str:
        items: list[dict] = []
        cont = None
        while True:
            page = await self.client.list(
                self.res,
                self.namespace,
                limit=self.page_size,
                labelSelector=self.label_selector,
                fieldSelector=self.field_selector,
                **({"continue": cont} if cont else {}),
            )
            kind = self.res.kind
            for it in page.get("items", []):
                it.setdefault("kind", kind)
                it.setdefault("apiVersion", self.res.api_version)
                items.append(self._trim(it))
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                rv = page["metadata"]["resourceVersion"]
                break
        fresh = {key_of(o): o for o in items}
        for k in list(self.store):
            if k not in fresh:
                # gone at the latest by the list's version; the cached copy is older
                self._apply("DELETED", self.store[k], gone_at=int(rv))
        for k, o in fresh.items():
            old = self.store.get(k)
            if old is None or old["metadata"].get("resourceVersion") != o["metadata"].get(
                "resourceVersion"
            ):
                self._apply("MODIFIED" if old else "ADDED", o)
        return rv
