"""The bundled agent-sandbox operator (``jupyter-sandbox operator``).

Reconcilers for Sandbox, SandboxTemplate, SandboxWarmPool and SandboxClaim
(agents.x-k8s.io / extensions.agents.x-k8s.io v1beta1).  See README.md here.
"""

from .cli import main

__all__ = ["main"]
