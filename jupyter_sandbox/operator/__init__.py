"""The bundled agent-sandbox operator (``jupyter-sandbox operator``).

Reconcilers for Sandbox, SandboxTemplate, SandboxWarmPool and SandboxClaim
(agents.x-k8s.io / extensions.agents.x-k8s.io v1beta1).  See README.md here.
The entry point is ``operator.cli.main``; importing this package loads nothing
else, so its small pure modules (``user_volume``) are cheap to import elsewhere.
"""
