"""Python SDK for jupyter-sandbox, shaped like upstream's ``k8s-agent-sandbox``.

::

    from jupyter_sandbox.client import SandboxClient

    client = SandboxClient()                      # local backend by default
    with client.create_sandbox(warmpool="default") as sb:
        sb.files.write("run.py", "print('hi')")
        r = sb.commands.run("python3 run.py", timeout=60)
        print(r.stdout, r.stderr, r.exit_code)
        kc = sb.kernel()                          # a jupyter_client KernelClient

Code written for upstream moves over by changing the import; see docs/sdk.md
for the differences.
"""

from .aio import AsyncCommandStream, AsyncSandbox, AsyncSandboxClient
from .exceptions import (
    SandboxBackendUnavailableError,
    SandboxClaimFailedError,
    SandboxError,
    SandboxInvalidRequestError,
    SandboxKernelBusyError,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SandboxPathError,
    SandboxPortForwardError,
    SandboxQuotaExceededError,
    SandboxRequestError,
    SandboxTemplateNotFoundError,
    SandboxTimeoutError,
    SandboxWarmPoolNotFoundError,
)
from .models import (
    ExecutionResult,
    FileEntry,
    LocalBackendConfig,
    OutputChunk,
    SandboxDirectConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
    SandboxTracerConfig,
)
from .sync import CommandStream, Sandbox, SandboxClient

__all__ = [
    "AsyncCommandStream",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "CommandStream",
    "ExecutionResult",
    "FileEntry",
    "LocalBackendConfig",
    "OutputChunk",
    "Sandbox",
    "SandboxBackendUnavailableError",
    "SandboxClaimFailedError",
    "SandboxClient",
    "SandboxDirectConnectionConfig",
    "SandboxError",
    "SandboxGatewayConnectionConfig",
    "SandboxInClusterConnectionConfig",
    "SandboxInvalidRequestError",
    "SandboxKernelBusyError",
    "SandboxLocalTunnelConnectionConfig",
    "SandboxNotFoundError",
    "SandboxNotReadyError",
    "SandboxPathError",
    "SandboxPortForwardError",
    "SandboxQuotaExceededError",
    "SandboxRequestError",
    "SandboxTemplateNotFoundError",
    "SandboxTimeoutError",
    "SandboxTracerConfig",
    "SandboxWarmPoolNotFoundError",
]
