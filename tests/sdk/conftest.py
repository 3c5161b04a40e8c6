"""Fixtures for the SDK tests: one shared sandbox for the read-mostly tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_sandbox.client import Sandbox, SandboxClient
from jupyter_sandbox.control_plane.base import ClaimStatus
from jupyter_sandbox.control_plane.local.client import LocalControlPlane


def local_claims(home: Path, labels: dict[str, str] | None = None) -> list[ClaimStatus]:
    """The daemon's claims, asked directly (not through the SDK under test)."""

    async def ask() -> list[ClaimStatus]:
        plane = LocalControlPlane(home)
        try:
            return await plane.list_claims(labels)
        finally:
            await plane.close()

    return asyncio.run(ask())


def claim_names(home: Path) -> set[str]:
    return {claim.name for claim in local_claims(home)}


@pytest.fixture(scope="module")
def client() -> Iterator[SandboxClient]:
    with SandboxClient() as sdk:
        yield sdk


@pytest.fixture(scope="module")
def sandbox(client: SandboxClient) -> Iterator[Sandbox]:
    """One sandbox shared by a module's tests (claims are cheap, CPU is not)."""
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        yield sb
