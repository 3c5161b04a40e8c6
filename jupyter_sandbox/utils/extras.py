"""Which extra of this package provides a missing module, for clear errors.

The base install is the sandbox runtime only; the Jupyter side, the Kubernetes
side and JupyterLab are extras (pyproject.toml).  A command of a role whose
extra is not installed says which one to install instead of a traceback.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement

DISTRIBUTION = "jupyter-sandbox"
# Import names that differ from their distribution's name.
_DISTRIBUTION_OF = {"jwt": "pyjwt", "zmq": "pyzmq", "yaml": "pyyaml"}


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def extras_providing(module: str) -> list[str]:
    """The extras of this package that require the distribution of ``module``."""
    top = module.split(".")[0]
    wanted = _canonical(_DISTRIBUTION_OF.get(top, top))
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    extras: list[str] = []
    for line in requirements:
        req = Requirement(line)
        if _canonical(req.name) != wanted or req.marker is None:
            continue
        for extra in _extras_in(str(req.marker)):
            if extra not in extras:
                extras.append(extra)
    return extras


def _extras_in(marker: str) -> list[str]:
    # markers here are only ever `extra == "name"` (joined by `or`)
    return [part.split("==")[1].strip().strip("'\"") for part in marker.split(" or ")]


def missing_extra_message(
    command: str, exc: ModuleNotFoundError, preferred: str | None = None
) -> str:
    """What to install; ``preferred`` is the command's own role when it has one."""
    module = exc.name or "a module"
    extras = [e for e in extras_providing(module) if e not in ("all", "test")]
    if not extras:
        return f"{command}: {module} is not installed ({exc})"
    extra = preferred if preferred in extras else extras[0]
    spec = f"{DISTRIBUTION}[{extra}]"
    return f"{command}: needs the {extra!r} extra ({module} is missing): pip install '{spec}'"
