"""What of the Jupyter server's environment may reach a sandbox: by default nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# jupyter_server hands kernels its whole environment: cloud credentials, hub tokens,
# everything. Only names listed in the kernelspec's env or explicitly allowed pass.
ALWAYS_DROPPED_PREFIXES = ("JUPYTERHUB_", "JPY_", "AWS_", "GOOGLE_", "AZURE_", "KUBERNETES_")


def filter_env(
    env: Mapping[str, str],
    *,
    kernelspec_env: Iterable[str] = (),
    allow: Iterable[str] = (),
) -> dict[str, str]:
    wanted = set(kernelspec_env) | set(allow)
    result = {}
    for name in sorted(wanted):
        if name in env and not (name.startswith(ALWAYS_DROPPED_PREFIXES) and name not in allow):
            result[name] = env[name]
    return result
