"""The Kubernetes control plane: sandboxes as agent-sandbox SandboxClaims."""

from .backend import KubernetesControlPlane

__all__ = ["KubernetesControlPlane"]
