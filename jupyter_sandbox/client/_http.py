"""HTTP to one sandbox's runtime, through the router (or straight to the pod)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from ..control_plane.base import Endpoint
from .exceptions import SandboxRequestError

CONNECT_TIMEOUT = 10.0
# Added to a request's own timeout: the runtime answers a command's timeout
# itself (exit code 124), so the HTTP request must outlive it a little.
TIMEOUT_MARGIN = 15.0


def _detail(response: httpx.Response) -> str:
    try:
        body = json.loads(response.content or b"null")
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)
    return str(body)[:500]


class RuntimeHTTP:
    """An ``httpx.AsyncClient`` bound to one sandbox endpoint, on the loop that uses it."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                # Retries cover failed connects only, never a request that was sent.
                transport=httpx.AsyncHTTPTransport(retries=2),
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    def _headers(self, timeout: float | None) -> dict[str, str]:
        headers = self.endpoint.headers()
        if timeout is not None:
            # The router must wait for the runtime's own timeout answer (exit code 124).
            headers["X-Sandbox-Timeout"] = f"{timeout + TIMEOUT_MARGIN / 2:g}"
        return headers

    @staticmethod
    def _timeout(timeout: float | None) -> httpx.Timeout:
        total = None if timeout is None else timeout + TIMEOUT_MARGIN
        return httpx.Timeout(total, connect=CONNECT_TIMEOUT)

    def _check(self, method: str, path: str, response: httpx.Response, allowed: tuple[int, ...]):
        if response.status_code in allowed:
            return
        if response.is_redirect:
            raise SandboxRequestError(
                f"redirect from the sandbox refused ({response.status_code})",
                status_code=response.status_code,
                response=response,
            )
        if response.status_code >= 400:
            raise SandboxRequestError(
                f"{method} /{path} failed with {response.status_code}: {_detail(response)}",
                status_code=response.status_code,
                response=response,
            )

    async def request(
        self,
        method: str,
        path: str,
        *,
        timeout: float | None,
        allowed: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> httpx.Response:
        url = self.endpoint.url(path)
        try:
            response = await self.client.request(
                method,
                url,
                headers=self._headers(timeout),
                timeout=self._timeout(timeout),
                **kwargs,
            )
        except httpx.TimeoutException as exc:
            raise SandboxRequestError(f"{method} /{path} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise SandboxRequestError(
                f"failed to reach sandbox {self.endpoint.name} at {url}: {exc!r}"
            ) from exc
        self._check(method, path, response, allowed)
        return response

    @asynccontextmanager
    async def stream(
        self, method: str, path: str, *, timeout: float | None, **kwargs: Any
    ) -> AsyncIterator[httpx.Response]:
        url = self.endpoint.url(path)
        try:
            async with self.client.stream(
                method,
                url,
                headers=self._headers(timeout),
                timeout=self._timeout(timeout),
                **kwargs,
            ) as response:
                if response.status_code >= 300:
                    await response.aread()
                    self._check(method, path, response, ())
                yield response
        except httpx.TimeoutException as exc:
            raise SandboxRequestError(f"{method} /{path} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise SandboxRequestError(
                f"failed to reach sandbox {self.endpoint.name} at {url}: {exc!r}"
            ) from exc

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
