"""The event hub's pool listing, in process, with stand-in kernel managers and planes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.control_plane.base import BackendUnavailable
from jupyter_sandbox.kernelspec import make_kernelspec
from jupyter_sandbox.server_extension import events


class Kernels:
    def list_kernel_ids(self) -> list[str]:
        return []


class Specs:
    def __init__(self, specs: dict[str, Any]) -> None:
        self.specs = specs

    def get_all_specs(self) -> dict[str, Any]:
        return {name: {"resource_dir": "", "spec": spec} for name, spec in self.specs.items()}


class App:
    def __init__(self, specs: dict[str, Any]) -> None:
        self.kernel_manager = Kernels()
        self.kernel_spec_manager = Specs(specs)


async def test_watching_never_starts_the_local_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_SANDBOX_HOME", str(tmp_path / "home"))
    hub = events.EventHub(App({}))
    try:
        await hub.refresh_pools()
        assert hub.snapshot["daemon"]["running"] is False
        assert hub.snapshot["pools"] == []
        assert not (tmp_path / "home" / "daemon.sock").exists(), "looking started a daemon"
        assert "kubernetes" not in hub.snapshot
    finally:
        await hub.close()


async def test_kubernetes_pools_are_listed_per_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_SANDBOX_HOME", str(tmp_path / "home"))
    specs = {
        "sandbox-kubernetes-gpu": make_kernelspec(
            "gpu", backend="kubernetes", backend_options={"namespace": "team-a"}
        ),
        "sandbox-kubernetes-cpu": make_kernelspec(
            "cpu", backend="kubernetes", backend_options={"namespace": "team-a"}
        ),
        "sandbox-default": make_kernelspec("default"),
    }
    asked: list[dict[str, Any]] = []

    async def pools(options: dict[str, Any]) -> list[dict[str, Any]]:
        asked.append(options)
        return [{"name": "gpu", "namespace": "team-a", "replicas": 2, "ready": 1}]

    monkeypatch.setattr(events, "_kubernetes_pools", pools)
    hub = events.EventHub(App(specs))
    try:
        await hub.refresh_kubernetes_pools()
        assert asked == [{"namespace": "team-a"}], "one listing per distinct backend"
        (pool,) = hub.snapshot["pools"]
        assert pool["name"] == "gpu" and pool["backend"] == "kubernetes" and pool["ready"] == 1
        assert hub.snapshot["kubernetes"] == {"ok": True, "message": ""}

        async def unreachable(options: dict[str, Any]) -> list[dict[str, Any]]:
            raise BackendUnavailable("the API server is unreachable")

        monkeypatch.setattr(events, "_kubernetes_pools", unreachable)
        await hub.refresh_kubernetes_pools()
        assert hub.snapshot["pools"] == []
        assert hub.snapshot["kubernetes"] == {
            "ok": False,
            "message": "the API server is unreachable",
        }
    finally:
        await hub.close()
