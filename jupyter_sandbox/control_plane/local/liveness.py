"""Liveness of running sandboxes: a runtime that stops answering is restarted.

A process can be alive and useless (stopped with SIGSTOP from inside, wedged in
a loop): the claim would stay Ready while every request times out. Like a
kubelet's liveness probe, the daemon asks each ready runtime for ``/healthz``
and restarts one that fails several times in a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .runtime_calls import RuntimeCalls

PERIOD_SECONDS = 5.0
TIMEOUT_SECONDS = 5.0
FAILURE_THRESHOLD = 3


@dataclass
class LivenessProbe:
    """Consecutive failures per sandbox."""

    calls: RuntimeCalls
    failures: dict[str, int] = field(default_factory=dict)

    async def healthy(self, socket: Path) -> bool:
        status, _ = await self.calls.call(socket, "GET", "/healthz", timeout=TIMEOUT_SECONDS)
        return status == 200

    async def failed(self, name: str, socket: Path) -> bool:
        """Probe once; True when ``name`` has now failed FAILURE_THRESHOLD times in a row."""
        if await self.healthy(socket):
            self.failures.pop(name, None)
            return False
        count = self.failures[name] = self.failures.get(name, 0) + 1
        if count >= FAILURE_THRESHOLD:
            self.failures.pop(name, None)
            return True
        return False
