"""What ``jupyter-sandbox lab`` sets for the user, where the user set nothing.

Idle sandboxed kernels are suspended, not shut down (variables and files are
kept), so culling them costs the user little; and File > New makes a sandboxed
notebook. But a setting the user made, on the command line or in a Jupyter
config file, always wins: the defaults go on the command line only for the
settings nobody made, and the banner says the timeout that is in force.

``--sandbox-only`` (lab's own option) goes further: only the sandbox
kernelspecs are offered, a kernel started under any other name is sandboxed
too, and JupyterLab's terminal (a shell on the host) is off.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# With tabs open too, after an hour.
LAB_CULLING: dict[str, Any] = {
    "cull_idle_timeout": 3600,
    "cull_interval": 300,
    "cull_connected": True,
}
# The culling traits are MappingKernelManager's; a subclass's section sets them too.
SECTIONS = ("MappingKernelManager", "AsyncMappingKernelManager", "SandboxKernelManager")
DEFAULT_KERNEL = "default_kernel_name"  # MultiKernelManager's
SANDBOX_ONLY = "--sandbox-only"


TRAITS = (*LAB_CULLING, DEFAULT_KERNEL)
KERNEL_MANAGER_SECTIONS = ("MultiKernelManager", *SECTIONS)


def from_command_line(args: Iterable[str]) -> dict[str, str]:
    """``--Section.trait=value`` arguments among ``args`` for the kernel manager
    traits lab gives defaults to, by trait name."""
    found = {}
    for arg in args:
        key, sep, value = arg.lstrip("-").partition("=")
        section, _, trait = key.rpartition(".")
        if sep and section in KERNEL_MANAGER_SECTIONS and trait in TRAITS:
            found[trait] = value
    return found


def from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel manager traits (of those lab gives defaults to) a loaded config sets."""
    found = {}
    for section in KERNEL_MANAGER_SECTIONS:
        values = config.get(section) or {}
        for trait in TRAITS:
            if trait in values:
                found[trait] = values[trait]
    return found


def default_kernel(lab_args: list[str], configured: Mapping[str, Any], kernel: str) -> list[str]:
    """File > New makes a notebook on ``kernel`` unless the user named another."""
    if DEFAULT_KERNEL in {**configured, **from_command_line(lab_args)}:
        return []
    return [f"--MappingKernelManager.{DEFAULT_KERNEL}={kernel}"]


def sandbox_only(kernelspecs: Iterable[str]) -> list[str]:
    """The arguments of ``--sandbox-only``: only these kernelspecs, a kernel of
    any other name sandboxed too, and no terminal on the host."""
    allowed = [f"--KernelSpecManager.allowed_kernelspecs={name}" for name in kernelspecs]
    return [
        *allowed,
        "--KernelSpecManager.ensure_native_kernel=False",
        "--KernelProvisionerFactory.default_provisioner_name=sandbox-provisioner",
        "--ServerApp.terminals_enabled=False",
    ]


def from_config_files() -> dict[str, Any]:
    """What the user's (and the environment's, and the system's) Jupyter config
    files set: jupyter_server_config and jupyter_lab_config, .py and .json, and
    the JSON of jupyter_server_config.d directories."""
    from jupyter_server.serverapp import ServerApp
    from jupyterlab.labapp import LabApp

    found: dict[str, Any] = {}
    for app_class in (ServerApp, LabApp):
        app = app_class()
        app.load_config_file()
        found.update(from_config(app.config))
        for directory in reversed(app.config_file_paths):  # the first path wins
            for path in sorted(Path(directory).glob(f"{app.config_file_name}.d/*.json")):
                try:
                    found.update(from_config(json.loads(path.read_text())))
                except (OSError, ValueError):
                    continue
    return found


def culling(lab_args: list[str], configured: Mapping[str, Any]) -> tuple[list[str], str]:
    """The arguments to add for the settings nobody made, and the banner's line
    about the culling in force."""
    given = {**configured, **from_command_line(lab_args)}
    added = [
        f"--MappingKernelManager.{trait}={value}"
        for trait, value in LAB_CULLING.items()
        if trait not in given
    ]
    effective = {**LAB_CULLING, **given}
    try:
        timeout = float(effective["cull_idle_timeout"])
    except (TypeError, ValueError):
        timeout = float(LAB_CULLING["cull_idle_timeout"])
    connected = str(effective["cull_connected"]).strip().lower() in ("true", "1", "yes")
    return added, banner(timeout, connected)


def banner(timeout: float, connected: bool) -> str:
    """What the banner says of culling."""
    if timeout <= 0:
        return (
            "  culling: off (idle kernels keep their sandboxes; "
            "--MappingKernelManager.cull_idle_timeout=SECONDS turns it on)"
        )
    minutes = timeout / 60
    when = f"{minutes:g} min" if minutes >= 1 else f"{timeout:g} s"
    tabs = "open tabs or not" if connected else "once no tab shows them"
    return (
        f"  culling: idle kernels are suspended after {when}, {tabs}; files and "
        "variables are kept and the next run resumes them "
        "(change with --MappingKernelManager.cull_idle_timeout=SECONDS, 0 to turn off)"
    )
