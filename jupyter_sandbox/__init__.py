"""Sandboxed Jupyter kernels claimed from warm pools."""

from ._version import __version__

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_sandbox.server_extension"}]
