"""The agent-sandbox resource model, as kubernetes-sigs/agent-sandbox v1beta1 defines it.

API groups and resources, and the label and annotation keys its controllers
write, so that objects written by either controller are understood by the
other.  Everything that talks to Kubernetes (the operator, the control plane's
Kubernetes backend, the router) takes them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

SANDBOX_GROUP = "agents.x-k8s.io"
EXT_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
SANDBOX_API = f"{SANDBOX_GROUP}/{VERSION}"
EXT_API = f"{EXT_GROUP}/{VERSION}"

NAME_HASH_LABEL = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH_LABEL = "agents.x-k8s.io/sandbox-template-ref-hash"
TEMPLATE_HASH_LABEL = "agents.x-k8s.io/sandbox-template-hash"
POD_TEMPLATE_HASH_LABEL = (
    "agents.x-k8s.io/sandbox-pod-template-hash"  # deprecated upstream, still written
)
LAUNCH_TYPE_LABEL = "agents.x-k8s.io/launch-type"
CREATED_BY_LABEL = "agents.x-k8s.io/created-by"
CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid"
ADOPTABLE_LABEL = "agents.x-k8s.io/adoptable"
TEMPLATE_REF_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
ASSIGNED_SANDBOX_ANNOTATION = "agents.x-k8s.io/sandbox-name"
# When the controller first saw a claim (RFC 3339 with nanoseconds), for latency metrics.
FIRST_OBSERVED_ANNOTATION = "agents.x-k8s.io/controller-first-observed-at"
PROPAGATED_LABELS_ANNOTATION = "agents.x-k8s.io/propagated-labels"


def name_hash(name: str) -> str:
    """FNV-1a 32-bit of ``name`` as 8 lowercase hex digits (upstream NameHash)."""
    h = 0x811C9DC5
    for b in name.encode():
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


@dataclass(frozen=True)
class Resource:
    """A REST resource: group/version/plural (namespaced)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def gvp(self) -> tuple[str, str, str]:
        """(group, version, plural), as the kubernetes client's custom-object calls take them."""
        return self.group, self.version, self.plural

    def path(
        self, namespace: str | None = None, name: str | None = None, sub: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if sub:
                base += f"/{sub}"
        return base


SANDBOX = Resource(SANDBOX_GROUP, VERSION, "sandboxes", "Sandbox")
TEMPLATE = Resource(EXT_GROUP, VERSION, "sandboxtemplates", "SandboxTemplate")
WARMPOOL = Resource(EXT_GROUP, VERSION, "sandboxwarmpools", "SandboxWarmPool")
CLAIM = Resource(EXT_GROUP, VERSION, "sandboxclaims", "SandboxClaim")
