"""One control-plane client per backend and options, shared within a process."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
from typing import Any

from .base import ControlPlane, InvalidRequest

_cache: dict[tuple[int, str, tuple[tuple[str, str], ...]], ControlPlane] = {}
_loops: dict[tuple[int, str, tuple[tuple[str, str], ...]], asyncio.AbstractEventLoop] = {}


def get_control_plane(backend: str = "local", **options: Any) -> ControlPlane:
    """The shared client for ``backend`` in this event loop."""
    loop = asyncio.get_running_loop()
    key = (id(loop), backend, tuple(sorted((k, str(v)) for k, v in options.items())))
    plane = _cache.get(key)
    if plane is None:
        plane = _create(backend, options)
        _cache[key] = plane
        _loops[key] = loop
    return plane


@atexit.register
def _close_all() -> None:
    """Close the shared clients whose loops still run (a background loop's thread):
    their connection pools end cleanly rather than being collected open."""
    for key, plane in list(_cache.items()):
        loop = _loops.pop(key, None)
        del _cache[key]
        if loop is None or loop.is_closed() or not loop.is_running():
            continue
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(plane.close(), loop).result(timeout=5)


def _create(backend: str, options: dict[str, Any]) -> ControlPlane:
    if backend == "local":
        from pathlib import Path

        from .local.client import LocalControlPlane

        base = options.get("state_dir")
        return LocalControlPlane(Path(base) if base else None)
    if backend == "kubernetes" and options.get("claim_service_url"):
        from .service_client import ClaimServiceControlPlane

        return ClaimServiceControlPlane(**options)
    if backend == "kubernetes":
        try:
            from .kubernetes.backend import KubernetesControlPlane
        except ImportError as exc:
            raise InvalidRequest(f"the kubernetes backend is not available: {exc}") from None
        return KubernetesControlPlane(**options)
    raise InvalidRequest(f"unknown sandbox backend {backend!r}", hint="use 'local' or 'kubernetes'")
