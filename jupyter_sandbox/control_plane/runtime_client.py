"""Calls to a sandbox runtime's kernel endpoints, through the router."""

from __future__ import annotations

import json
import logging
from typing import Any

from tornado import httpclient

from .base import ClaimStatus, Endpoint, Phase, kernel_busy_error, state_not_saved_error

log = logging.getLogger(__name__)


class RuntimeCallError(Exception):
    """The runtime could not be reached or refused the call."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


# The kernel endpoints answer a few hundred bytes of JSON; what a runtime sends is
# untrusted, so anything larger is refused before it is held or parsed.
MAX_ANSWER_BYTES = 1024 * 1024

_client: httpclient.AsyncHTTPClient | None = None


def _http() -> httpclient.AsyncHTTPClient:
    global _client
    if _client is None:
        _client = httpclient.AsyncHTTPClient(
            force_instance=True, max_clients=50, max_body_size=MAX_ANSWER_BYTES
        )
    return _client


async def call(
    endpoint: Endpoint, method: str, path: str, body: Any = None, timeout: float = 60.0
) -> dict[str, Any]:
    request = httpclient.HTTPRequest(
        endpoint.url(path),
        method=method,
        headers={**endpoint.headers(), "Content-Type": "application/json"},
        body=json.dumps(body if body is not None else {}) if method == "POST" else None,
        request_timeout=timeout,
        connect_timeout=10,
    )
    try:
        response = await _http().fetch(request, raise_error=False)
    except OSError as exc:
        raise RuntimeCallError(f"sandbox runtime unreachable: {exc}") from None
    except httpclient.HTTPClientError as exc:  # a dropped connection, an answer too large
        raise RuntimeCallError(
            f"runtime {path}: no usable answer ({exc}; answers stop at {MAX_ANSWER_BYTES} bytes)"
        ) from None
    if response.code == 599 or response.code >= 400:
        body = (response.body or b"")[:300]
        detail = body.decode(errors="replace") if body else str(response.error)
        raise RuntimeCallError(f"runtime {path} answered {response.code}: {detail}", response.code)
    try:
        answer = json.loads(response.body or b"{}")
    except ValueError:
        raise RuntimeCallError(f"runtime {path}: the answer is not JSON") from None
    if not isinstance(answer, dict):
        raise RuntimeCallError(f"runtime {path}: the answer is not a JSON object")
    return answer


async def kernel_busy(endpoint: Endpoint) -> bool:
    """Whether the runtime's kernel is running a cell now (False if it cannot say)."""
    try:
        answer = await call(endpoint, "GET", "api/kernel", timeout=10)
    except RuntimeCallError:
        return False
    return busy_answer(answer)


def busy_answer(answer: Any) -> bool:
    """Whether a runtime's ``GET /api/kernel`` answer says its kernel is running a cell."""
    kernel = answer.get("kernel") if isinstance(answer, dict) else None
    return isinstance(kernel, dict) and kernel.get("execution_state") == "busy"


async def save_kernel_state(
    endpoint: Endpoint, name: str, *, max_bytes: int, timeout: float
) -> str | None:
    """Have the runtime save its kernel's variables on the workspace volume (before a
    suspend): the next pod's runtime loads them into its new kernel.

    None when saved, or when there is nothing to save (no kernel, no runtime to
    reach); else why the runtime could not save them (too slow, failed).
    """
    body = {"max_bytes": max_bytes, "timeout": timeout}
    try:
        result = await call(endpoint, "POST", "api/kernel/state", body, timeout=timeout + 10)
    except RuntimeCallError as exc:
        if exc.status in (500, 504):
            log.warning("claim %s: kernel state not saved: %s", name, exc)
            return str(exc)
        log.info("claim %s: no kernel state to save: %s", name, exc)
        return None
    log.info("claim %s: kernel state saved: %s", name, ", ".join(result.get("saved", [])))
    return None


async def before_suspend(
    status: ClaimStatus | None, *, force: bool, save: bool, max_bytes: int, timeout: float
) -> None:
    """What a suspend of a claim's sandbox does first, when it is Ready and its
    runtime known: refuse a kernel running a cell, then save its variables and
    refuse if that fails; ``force`` skips the refusals (the save is still tried)."""
    if status is None or status.endpoint is None or status.phase != Phase.READY:
        return
    endpoint, name = status.endpoint, status.name
    if not force and await kernel_busy(endpoint):
        raise kernel_busy_error(name)
    if save:
        error = await save_kernel_state(endpoint, name, max_bytes=max_bytes, timeout=timeout)
        if error is not None and not force:
            raise state_not_saved_error(name, error)
