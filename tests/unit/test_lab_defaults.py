"""`jupyter-sandbox lab`'s culling defaults: only where the user set nothing, said truly."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_sandbox.lab_defaults import culling, from_command_line, from_config

ALL = [
    "--MappingKernelManager.cull_idle_timeout=3600",
    "--MappingKernelManager.cull_interval=300",
    "--MappingKernelManager.cull_connected=True",
]


@pytest.mark.parametrize(
    ("args", "configured", "added", "said"),
    [
        ([], {}, ALL, "after 60 min, open tabs or not"),
        (["--MappingKernelManager.cull_idle_timeout=120"], {}, ALL[1:], "after 2 min"),
        ([], {"cull_idle_timeout": 90}, ALL[1:], "after 1.5 min"),
        ([], {"cull_idle_timeout": 30, "cull_connected": False}, [ALL[1]], "once no tab"),
        (["--SandboxKernelManager.cull_interval=5"], {}, [ALL[0], ALL[2]], "after 60 min"),
        (["--MappingKernelManager.cull_idle_timeout=0"], {}, ALL[1:], "culling: off"),
        # the command line wins over a file
        (["--MappingKernelManager.cull_idle_timeout=600"], {"cull_idle_timeout": 60}, ALL[1:],
         "after 10 min"),
    ],
)  # fmt: skip
def test_defaults_fill_only_what_is_unset(
    args: list[str], configured: dict[str, Any], added: list[str], said: str
) -> None:
    got, banner = culling(args, configured)
    assert got == added
    assert said in banner, banner


def test_what_counts_as_a_setting() -> None:
    assert from_command_line(
        ["--port=1", "--MappingKernelManager.cull_interval=5", "--Other.cull_interval=9"]
    ) == {"cull_interval": "5"}
    assert from_config(
        {"AsyncMappingKernelManager": {"cull_connected": False}, "ServerApp": {"port": 1}}
    ) == {"cull_connected": False}


def test_file_new_makes_a_sandboxed_notebook_unless_the_user_chose() -> None:
    from jupyter_sandbox.lab_defaults import default_kernel

    chosen = ["--MappingKernelManager.default_kernel_name=sandbox-default"]
    assert default_kernel([], {}, "sandbox-default") == chosen
    assert default_kernel(["--MultiKernelManager.default_kernel_name=python3"], {}, "x") == []
    assert default_kernel([], {"default_kernel_name": "python3"}, "x") == []


def test_sandbox_only_offers_only_sandboxes_and_no_host_shell() -> None:
    from jupyter_sandbox.lab_defaults import sandbox_only

    args = sandbox_only(["sandbox-default", "sandbox-gpu"])
    assert "--KernelSpecManager.allowed_kernelspecs=sandbox-gpu" in args
    assert "--KernelProvisionerFactory.default_provisioner_name=sandbox-provisioner" in args
    assert "--ServerApp.terminals_enabled=False" in args
