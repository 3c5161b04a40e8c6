"""``KubernetesControlPlane``: sandboxes as agent-sandbox SandboxClaims.

Selected in a kernelspec with ``"backend": "kubernetes"``; ``backend_options``
(all JSON-simple) become constructor arguments, checked and typed by
``options.parse_options`` (an unknown option, or one of the wrong type or out of
range, is an ``InvalidRequest`` that names it):

``namespace``
    where claims are made (default: the in-cluster namespace, else the
    kubeconfig context's namespace, else ``default``).
``router_url`` / ``token_secret_file``
    reach sandboxes through the router (gateway) at this URL with a token scoped
    to the one sandbox, signed with the router's secret.  Without ``router_url``
    the runtime is reached directly at its pod IP (port 8888): only from inside
    the cluster network.
``router_auth``
    how the router admits this server: ``token`` (scoped tokens signed with
    ``token_secret_file``; the default when it is given), ``jupyterhub`` (the
    single-user server's ``$JUPYTERHUB_API_TOKEN``; claims are annotated
    ``jupyter-sandbox/user=$JUPYTERHUB_USER`` and the router, started with
    ``--hub-api-url``, lets each hub user reach only their own sandboxes; no
    router secret in user pods), or ``none``.
``claim_service_url``
    ask this claim service (``jupyter-sandbox claim-service``), showing it
    ``$JUPYTERHUB_API_TOKEN``, instead of calling the Kubernetes API: the
    server then holds no Kubernetes credentials and sees only its hub user's
    claims (``control_plane/service_client.py``; JupyterHub deployments).
    Only ``router_auth`` (``jupyterhub``) and the ``save_state`` options go
    with it.
``kubeconfig`` / ``context`` / ``in_cluster``
    which API server (default: in-cluster when in a pod, else ``$KUBECONFIG`` or
    ``~/.kube/config``).
``owner``
    an identity of this Jupyter server (e.g. the hub's server name); stored as
    the ``jupyter-sandbox/owner`` label so a restarted server can find exactly
    its claims (``list_claims({"jupyter-sandbox/owner": owner})``).
``request_timeout`` / ``max_connections``
    seconds per API request (default 30), and open connections to the API
    server at most (default 256; every claim being waited for holds one watch).
``save_state`` / ``state_max_mb`` / ``state_timeout``
    before a suspend, have the runtime save the kernel's variables on the
    workspace volume (default on, 1024 MB, 60 s), so the next pod's kernel gets
    them back; a failed save never blocks the suspend.

Mapping to the interface:

- ``claim`` creates a SandboxClaim (``warmPoolRef`` = the pool) carrying the
  request's labels, after checking that the pool exists (``PoolNotFound``).
- ``wait_ready`` WATCHes the claim until its Ready condition is True, then reads
  its Sandbox (``status.sandbox.name``) and, if that is not Ready for its
  current generation yet (a resume in flight), watches the Sandbox too.
- ``suspend`` first asks the runtime, through the router, to save the kernel's
  variables (``POST /api/kernel/state``).
- ``suspend``/``resume`` merge-patch the claimed Sandbox's
  ``spec.operatingMode`` (Suspended/Running) and return at once; phases
  Suspending/Suspended/Resuming are read from the Sandbox's conditions.
- ``release`` deletes the claim (404 is fine); the garbage collector removes
  the Sandbox and its Pod, Service and PVCs (ownerReferences).

Re-attaching after a Jupyter server restart: every claim carries the labels the
provisioner gives it (``jupyter-sandbox/kernel-id``, ``jupyter-sandbox/user``)
plus ``app.kubernetes.io/managed-by=jupyter-sandbox`` and, with the ``owner``
option, ``jupyter-sandbox/owner``.  A restarted server calls
``list_claims({"jupyter-sandbox/user": user})`` (or the owner label), re-attaches
the kernel ids it still knows (``SandboxSession(claim_name=...)``) and
``release``s the rest, which are orphans (``reap_orphans`` does that).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...agent_sandbox import (
    ASSIGNED_SANDBOX_ANNOTATION,
    CLAIM,
    EXT_API,
    LAUNCH_TYPE_LABEL,
    SANDBOX,
    WARMPOOL,
    Resource,
)
from ...kube.client import ApiError, Client, Unreachable, load_config
from ...kube.informer import Informer
from ...kube.times import now_rfc3339, parse_time
from ...kubernetes_credentials import CredentialsError
from ...operator.user_volume import (
    CLAIM_KERNEL_CWD_ANNOTATION,
    CLAIM_SERVER_ANNOTATION,
    CLAIM_USER_ANNOTATION,
)
from ...router.tokens import Scope, TokenAuthority
from ...utils.users import current_user
from ..base import (
    BackendUnavailable,
    ClaimError,
    ClaimNotFound,
    ClaimRequest,
    ClaimStatus,
    ClaimTimeout,
    ControlPlane,
    Endpoint,
    InvalidRequest,
    Phase,
    PoolNotFound,
    PoolStatus,
)
from ..runtime_client import before_suspend
from .options import parse_options

log = logging.getLogger(__name__)

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "jupyter-sandbox"
OWNER_LABEL = "jupyter-sandbox/owner"
USER_LABEL = "jupyter-sandbox/user"
KERNEL_ID_LABEL = "jupyter-sandbox/kernel-id"
OWNER_HOST_ANNOTATION = "jupyter-sandbox/owner-host"
RESUMED_AT_ANNOTATION = "jupyter-sandbox/resumed-at"
DISPLAY_NAME_ANNOTATION = "jupyter-sandbox/display-name"

# Claim Ready=False reasons the operator (ours or upstream's) will not recover from.
TERMINAL_REASONS = frozenset(
    {
        "WarmPoolNotFound",
        "TemplateNotFound",
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "UserVolumeError",
        "ClaimExpired",
        "SandboxExpired",
        "SandboxMissing",
        "InvalidConfiguration",
        "PodFailed",
        "PodSucceeded",
    }
)


def _condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return {}


def _fresh(obj: dict[str, Any], cond: dict[str, Any]) -> bool:
    """The condition was written for the object's current spec (observedGeneration)."""
    seen = cond.get("observedGeneration")
    gen = obj.get("metadata", {}).get("generation")
    return seen is None or gen is None or int(seen) >= int(gen)


def sandbox_ready(sandbox: dict[str, Any] | None) -> bool:
    if not sandbox or sandbox.get("metadata", {}).get("deletionTimestamp"):
        return False
    if (sandbox.get("spec") or {}).get("operatingMode", "Running") != "Running":
        return False
    ready = _condition(sandbox, "Ready")
    return ready.get("status") == "True" and _fresh(sandbox, ready)


def sandbox_name_of(claim: dict[str, Any]) -> str | None:
    name = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
    if not name:
        name = (claim["metadata"].get("annotations") or {}).get(ASSIGNED_SANDBOX_ANNOTATION)
    return name or None


def _terminal(claim: dict[str, Any]) -> dict[str, Any] | None:
    ready = _condition(claim, "Ready")
    if ready.get("status") == "False" and ready.get("reason") in TERMINAL_REASONS:
        return ready
    return None


class KubernetesControlPlane(ControlPlane):
    def __init__(self, **options: Any) -> None:
        """``options``: those of the module docstring; see ``options.parse_options``."""
        o = parse_options(options)
        if o["claim_service_url"]:
            raise InvalidRequest("claim_service_url is the claim service client's option")
        self._namespace_option = o["namespace"]
        self.router_url = (o["router_url"] or "").rstrip("/") or None
        self.kubeconfig = os.path.expanduser(o["kubeconfig"]) if o["kubeconfig"] else None
        self.context = o["context"]
        self.in_cluster = o["in_cluster"]
        self.owner = o["owner"]
        self.port = o["port"]
        self.request_timeout = o["request_timeout"]
        self.token_ttl = o["token_ttl"]
        self.save_state = o["save_state"]
        self.state_max_bytes = o["state_max_mb"] * 1024 * 1024
        self.state_timeout = o["state_timeout"]
        token_secret_file, router_auth = o["token_secret_file"], o["router_auth"]
        secret = o["token_secret"]
        if token_secret_file:
            try:
                with open(os.path.expanduser(token_secret_file)) as handle:
                    secret = handle.read().strip()
            except OSError as exc:
                raise InvalidRequest(
                    f"cannot read token_secret_file {token_secret_file!r}: {exc}",
                    hint="mount the router's token secret and point token_secret_file at it",
                ) from None
        self.router_auth = router_auth or ("token" if secret else "none")
        if self.router_auth == "token" and not secret:
            raise InvalidRequest(
                "router_auth 'token' needs the router's secret",
                hint="set token_secret_file, or router_auth 'jupyterhub' on a hub",
            )
        self.authority = TokenAuthority(secret) if self.router_auth == "token" and secret else None
        self.hub_user: str | None = None
        self.hub_token: str | None = None
        if self.router_auth == "jupyterhub":
            self.hub_user = os.environ.get("JUPYTERHUB_USER") or None
            self.hub_token = os.environ.get("JUPYTERHUB_API_TOKEN") or None
            if not (self.hub_user and self.hub_token):
                raise InvalidRequest(
                    "router_auth 'jupyterhub' needs JUPYTERHUB_USER and JUPYTERHUB_API_TOKEN",
                    hint="JupyterHub sets both for every single-user server",
                )
        self.max_connections = o["max_connections"]
        self._kube: Client | None = None
        self._kube_namespace = "default"
        self._kube_lock = asyncio.Lock()
        self._pools_seen: dict[str, float] = {}
        self._host = socket.gethostname()

    # -- plumbing ---------------------------------------------------------------

    async def _client(self) -> Client:
        if self._kube is None:
            async with self._kube_lock:
                if self._kube is None:
                    try:
                        settings = await asyncio.to_thread(
                            load_config,
                            kubeconfig=self.kubeconfig,
                            context=self.context,
                            in_cluster=self.in_cluster,
                        )
                    except CredentialsError as exc:
                        raise BackendUnavailable(
                            str(exc),
                            hint="set backend_options kubeconfig/context, or run in a pod",
                        ) from None
                    except Exception as exc:
                        raise BackendUnavailable(
                            f"cannot configure the Kubernetes client: {exc}"
                        ) from None
                    self._kube_namespace = settings.namespace
                    self._kube = Client(
                        settings,
                        max_connections=self.max_connections,
                        user_agent="jupyter-sandbox",
                        request_timeout=self.request_timeout,
                    )
        return self._kube

    @property
    def namespace(self) -> str:
        return self._namespace_option or self._kube_namespace

    async def _api(self, method: str, res: Resource, *args: Any, **kwargs: Any) -> Any:
        """One client call on ``res`` in this plane's namespace, errors mapped to
        ClaimErrors (ApiErrors that are not a ClaimError, such as a 404 or a 409,
        are left to the caller)."""
        kube = await self._client()
        # Only now is the namespace known when it comes from the credentials (a pod's).
        try:
            return await getattr(kube, method)(res, self.namespace, *args, **kwargs)
        except Unreachable as exc:
            raise self._unreachable(exc) from None
        except ApiError as exc:
            raise self._map(exc) from None

    @staticmethod
    def _unreachable(exc: Unreachable) -> BackendUnavailable:
        return BackendUnavailable(
            f"the Kubernetes API server is unreachable: {exc}",
            hint="check the kubeconfig / network, or that the cluster is up",
        )

    def _map(self, exc: ApiError) -> ClaimError | ApiError:
        if exc.resource_missing:
            return BackendUnavailable(
                "the agent-sandbox resources are not served by this API server",
                hint="install the CRDs (deploy/crds) and the operator",
            )
        if exc.status in (401, 403):
            return BackendUnavailable(
                f"the Kubernetes API server refused the request: {exc.message}",
                hint=f"grant this identity access to sandboxclaims in namespace {self.namespace}",
            )
        if exc.status == 422 or exc.status == 400:
            return InvalidRequest(exc.message)
        if exc.status >= 500 or exc.status == 429:
            return BackendUnavailable(f"the Kubernetes API server failed: {exc.message}")
        return exc

    async def _get(self, res: Resource, name: str) -> dict[str, Any] | None:
        try:
            return await self._api("get", res, name)  # type: ignore[no-any-return]
        except ApiError as exc:
            if exc.not_found:
                return None
            raise ClaimError(str(exc)) from None

    # -- claim ----------------------------------------------------------------------

    async def _check_pool(self, pool: str) -> None:
        if time.monotonic() - self._pools_seen.get(pool, -1e9) < 30:
            return
        if await self._get(WARMPOOL, pool) is None:
            try:
                names = sorted(p.name for p in await self.list_pools())
            except ClaimError:
                names = []
            raise PoolNotFound(
                f"SandboxWarmPool {pool!r} not found in namespace {self.namespace}",
                hint=(f"available pools: {', '.join(names)}" if names else "no pools exist")
                + "; set the kernelspec's pool, or create the pool (deploy/examples)",
            )
        self._pools_seen[pool] = time.monotonic()

    def _claim_body(self, request: ClaimRequest, name: str) -> dict[str, Any]:
        labels = {k: v for k, v in request.labels.items() if v}
        labels[MANAGED_BY_LABEL] = MANAGED_BY
        if self.owner:
            labels[OWNER_LABEL] = self.owner
        annotations = {
            OWNER_HOST_ANNOTATION: self._host,
            # Whose sandbox this is: the router (hub mode) admits only them, and a
            # template with a user volume mounts their volume.
            CLAIM_USER_ANNOTATION: request.user or self.hub_user or current_user(),
        }
        server_name = request.server_name
        if server_name is None:
            server_name = os.environ.get("JUPYTERHUB_SERVER_NAME")
        if server_name:
            annotations[CLAIM_SERVER_ANNOTATION] = server_name
        if request.files_dir:
            # The notebook's directory: where the kernel starts if the sandbox has it.
            annotations[CLAIM_KERNEL_CWD_ANNOTATION] = request.files_dir
        if request.owner_pid:
            annotations["jupyter-sandbox/owner-pid"] = str(request.owner_pid)
        spec: dict[str, Any] = {"warmPoolRef": {"name": request.pool}}
        if request.env:
            spec["env"] = [{"name": k, "value": v} for k, v in sorted(request.env.items())]
        return {
            "apiVersion": EXT_API,
            "kind": "SandboxClaim",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec,
        }

    async def claim(self, request: ClaimRequest) -> ClaimStatus:
        await self._client()
        await self._check_pool(request.pool)
        name = request.name or f"kernel-{uuid.uuid4().hex[:12]}"
        body = self._claim_body(request, name)
        try:
            created = await self._api("create", CLAIM, body)
        except BackendUnavailable:
            # The create may have gone through with the answer lost: never leak it.
            await self._release_quietly(name)
            raise
        except ApiError as exc:
            if exc.status == 409:
                raise InvalidRequest(f"a claim named {name!r} already exists") from None
            raise ClaimError(f"creating SandboxClaim {name}: {exc}") from None
        except asyncio.CancelledError:
            await asyncio.shield(self._release_quietly(name))
            raise
        return self._status(created, None)

    async def _release_quietly(self, name: str) -> None:
        try:
            await self.release(name)
        except Exception as exc:
            log.warning("could not release claim %s: %s", name, exc)

    # -- wait -----------------------------------------------------------------------

    async def wait_ready(self, name: str, timeout: float) -> ClaimStatus:
        """Watch the claim until Ready, then its Sandbox until Ready for its generation."""
        await self._client()
        deadline = time.monotonic() + timeout

        def claim_done(claim: dict[str, Any]) -> bool:
            term = _terminal(claim)
            if term is not None:
                reason = term.get("reason", "")
                msg = f"claim {name}: {reason}: {term.get('message', '')}"
                if reason == "WarmPoolNotFound":
                    raise PoolNotFound(msg, hint="the claim's SandboxWarmPool does not exist")
                raise ClaimError(msg)
            if claim["metadata"].get("deletionTimestamp"):
                raise ClaimNotFound(f"claim {name} is being deleted")
            ready = _condition(claim, "Ready")
            return ready.get("status") == "True" and sandbox_name_of(claim) is not None

        claim = await self._watch_until(
            CLAIM,
            name,
            claim_done,
            deadline,
            what=f"claim {name}",
            gone=lambda: ClaimNotFound(f"claim {name} does not exist"),
        )
        sb_name = sandbox_name_of(claim)
        assert sb_name is not None
        sandbox = await self._watch_until(
            SANDBOX,
            sb_name,
            sandbox_ready,
            deadline,
            what=f"sandbox {sb_name} of claim {name}",
            gone=lambda: ClaimError(f"sandbox {sb_name} of claim {name} is gone"),
        )
        return self._status(claim, sandbox)

    async def _watch_until(
        self,
        res: Resource,
        name: str,
        done: Callable[[dict[str, Any]], bool],
        deadline: float,
        *,
        what: str,
        gone: Callable[[], ClaimError],
    ) -> dict[str, Any]:
        """Watch one object (an informer on its name: no thread, no polling) until
        ``done`` says so; ``gone`` once it is absent, ClaimTimeout at the deadline."""
        kube = await self._client()
        informer = Informer(kube, res, self.namespace, field_selector=f"metadata.name={name}")
        last: list[dict[str, Any] | None] = [None]

        def check() -> dict[str, Any] | None:
            error = informer.last_error
            # A server that goes away fails the wait at once, as every other call
            # does, rather than at the deadline.
            if isinstance(error, Unreachable):
                raise self._unreachable(error)
            if error is not None and not informer.synced.is_set():
                # Before the first list: no access or no CRDs is an answer.
                if isinstance(error, ApiError):
                    mapped = self._map(error)
                    raise (
                        mapped
                        if isinstance(mapped, ClaimError)
                        else ClaimError(f"waiting for {what}: {error}")
                    )
            if not informer.synced.is_set():
                return None
            obj = informer.get(self.namespace, name)
            if obj is None:
                raise gone()
            last[0] = obj
            return obj if done(obj) else None

        async with informer.running():
            try:
                return await informer.wait_until(check, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise ClaimTimeout(
                    f"{what} not ready after the timeout: {self._why(last[0])}",
                    hint="a cold start pulls the image and schedules a pod; "
                    "raise claim_timeout or grow the warm pool",
                ) from None

    @staticmethod
    def _why(obj: dict[str, Any] | None) -> str:
        ready = _condition(obj, "Ready")
        if not ready:
            return "no Ready condition yet (is the operator running?)"
        return f"{ready.get('reason', '')}: {ready.get('message', '')}".strip(": ")

    # -- suspend / resume ---------------------------------------------------------

    async def _bound(self, name: str) -> tuple[dict[str, Any], str]:
        claim = await self._get(CLAIM, name)
        if claim is None:
            raise ClaimNotFound(f"claim {name} does not exist")
        sb = sandbox_name_of(claim)
        if sb is None:
            raise InvalidRequest(f"claim {name} has no sandbox yet")
        return claim, sb

    async def _patch_sandbox(self, name: str, body: dict[str, Any]) -> ClaimStatus:
        claim, sb = await self._bound(name)
        try:
            sandbox = await self._api("patch", SANDBOX, sb, body)
        except ApiError as exc:
            if exc.not_found:
                raise ClaimNotFound(f"sandbox {sb} of claim {name} does not exist") from None
            raise ClaimError(f"patching sandbox {sb}: {exc}") from None
        return self._status(claim, sandbox)

    async def suspend(self, name: str, *, force: bool = False) -> ClaimStatus:
        """Refuse a busy kernel, save its variables on the workspace volume (the
        next pod's runtime loads them), then set the Sandbox Suspended."""
        await before_suspend(
            await self.status(name),
            force=force,
            save=self.save_state,
            max_bytes=self.state_max_bytes,
            timeout=self.state_timeout,
        )
        return await self._patch_sandbox(name, {"spec": {"operatingMode": "Suspended"}})

    async def resume(self, name: str) -> ClaimStatus:
        return await self._patch_sandbox(
            name,
            {
                "metadata": {"annotations": {RESUMED_AT_ANNOTATION: now_rfc3339()}},
                "spec": {"operatingMode": "Running"},
            },
        )

    # -- release / status / list ----------------------------------------------------

    async def release(self, name: str) -> None:
        try:
            await self._api("delete", CLAIM, name, propagation="Background")
        except ApiError as exc:
            if exc.not_found:
                return
            raise ClaimError(f"deleting claim {name}: {exc}") from None

    async def status(self, name: str) -> ClaimStatus | None:
        claim = await self._get(CLAIM, name)
        if claim is None:
            return None
        sb = sandbox_name_of(claim)
        sandbox = await self._get(SANDBOX, sb) if sb else None
        return self._status(claim, sandbox)

    async def list_claims(self, labels: dict[str, str] | None = None) -> list[ClaimStatus]:
        selector = ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items()))
        try:
            claims = await self._api("list", CLAIM, labelSelector=selector or None)
        except ApiError as exc:
            raise ClaimError(f"listing claims: {exc}") from None
        items = claims.get("items") or []
        wanted = {sandbox_name_of(c) for c in items} - {None}
        by_name: dict[str, dict[str, Any]] = {}
        if wanted:
            if len(wanted) <= 8:
                found = await asyncio.gather(*(self._get(SANDBOX, n) for n in wanted))  # type: ignore[arg-type]
                by_name = {s["metadata"]["name"]: s for s in found if s}
            else:
                sbs = await self._api("list", SANDBOX)
                by_name = {s["metadata"]["name"]: s for s in sbs.get("items") or []}
        return [self._status(c, by_name.get(sandbox_name_of(c) or "")) for c in items]

    async def reap_orphans(
        self, labels: dict[str, str], keep_kernel_ids: set[str] | frozenset[str]
    ) -> list[str]:
        """Release the claims matching ``labels`` whose kernel id is not in ``keep_kernel_ids``.

        For a restarted Jupyter server: ``labels`` selects its claims (user or
        owner label), ``keep_kernel_ids`` are the kernels it re-attached.
        Returns the names of the released claims.
        """
        released = []
        for status in await self.list_claims(labels):
            if status.phase == Phase.TERMINATING:
                continue
            if status.labels.get(KERNEL_ID_LABEL, "") in keep_kernel_ids:
                continue
            await self.release(status.name)
            released.append(status.name)
        if released:
            log.info("released %d orphaned claim(s): %s", len(released), ", ".join(released))
        return released

    async def list_pools(self) -> list[PoolStatus]:
        try:
            pools = await self._api("list", WARMPOOL)
        except ApiError as exc:
            raise ClaimError(f"listing pools: {exc}") from None
        result = []
        for pool in pools.get("items") or []:
            md, spec, st = pool["metadata"], pool.get("spec") or {}, pool.get("status") or {}
            ready = int(st.get("readyReplicas") or 0)
            total = int(st.get("replicas") or 0)
            result.append(
                PoolStatus(
                    name=md["name"],
                    namespace=md.get("namespace", self.namespace),
                    replicas=int(spec.get("replicas") or 0),
                    ready=ready,
                    starting=max(0, total - ready),
                    isolation="kubernetes",
                    display_name=(md.get("annotations") or {}).get(DISPLAY_NAME_ANNOTATION)
                    or f"Python 3 (sandbox: {md['name']})",
                )
            )
        return result

    async def close(self) -> None:
        kube, self._kube = self._kube, None
        if kube is not None:
            await kube.close()

    # -- status mapping ----------------------------------------------------------------

    def _phase(self, claim: dict[str, Any], sandbox: dict[str, Any] | None) -> Phase:
        if claim["metadata"].get("deletionTimestamp"):
            return Phase.TERMINATING
        if _terminal(claim) is not None:
            return Phase.FAILED
        if sandbox is None:
            return Phase.PENDING
        if sandbox["metadata"].get("deletionTimestamp"):
            return Phase.TERMINATING
        mode = (sandbox.get("spec") or {}).get("operatingMode", "Running")
        suspended = _condition(sandbox, "Suspended")
        if mode == "Suspended":
            if suspended.get("status") == "True" and _fresh(sandbox, suspended):
                return Phase.SUSPENDED
            return Phase.SUSPENDING
        if sandbox_ready(sandbox):
            return Phase.READY
        finished = _condition(sandbox, "Finished")
        if finished.get("status") == "True":
            return Phase.FAILED
        ready = _condition(sandbox, "Ready")
        resumed = parse_time(
            (sandbox["metadata"].get("annotations") or {}).get(RESUMED_AT_ANNOTATION)
        )
        if resumed is not None:
            since = parse_time(ready.get("lastTransitionTime"))
            if (
                suspended.get("status") == "True"
                or ready.get("reason") == "SandboxSuspended"
                or since is None
                or since <= resumed
            ):
                return Phase.RESUMING
        return Phase.PENDING

    def _status(self, claim: dict[str, Any], sandbox: dict[str, Any] | None) -> ClaimStatus:
        md = claim["metadata"]
        ns = md.get("namespace") or self.namespace
        phase = self._phase(claim, sandbox)
        sb_name = sandbox["metadata"]["name"] if sandbox else sandbox_name_of(claim)
        warm: bool | None = None
        runtime_class = None
        resources: dict[str, Any] = {}
        if sandbox is not None:
            launch = (sandbox["metadata"].get("labels") or {}).get(LAUNCH_TYPE_LABEL)
            warm = {"warm": True, "cold": False}.get(launch or "")
            pod_spec = ((sandbox.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}
            runtime_class = pod_spec.get("runtimeClassName")
            st = sandbox.get("status") or {}
            resources = {
                "pod": sb_name if phase not in (Phase.SUSPENDED,) else None,
                "node": st.get("nodeName"),
                "podIPs": list(st.get("podIPs") or []),
                "serviceFQDN": st.get("serviceFQDN"),
                "runtimeClassName": runtime_class,
                "operatingMode": (sandbox.get("spec") or {}).get("operatingMode", "Running"),
            }
        detail = f"pod in namespace {ns}"
        if runtime_class:
            detail += f", runtimeClassName {runtime_class}"
        ready_cond = _condition(claim, "Ready")
        message = ""
        if phase != Phase.READY:
            src = _condition(sandbox, "Ready") if sandbox is not None else ready_cond
            message = str(src.get("message") or ready_cond.get("message") or "")
        ready_at = None
        if sandbox is not None and phase == Phase.READY:
            ready_at = parse_time(_condition(sandbox, "Ready").get("lastTransitionTime"))
        return ClaimStatus(
            name=md["name"],
            namespace=ns,
            pool=((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name", ""),
            phase=phase,
            sandbox=sb_name,
            warm=warm,
            isolation="kubernetes",
            isolation_detail=detail,
            workspace=None,
            labels=dict(md.get("labels") or {}),
            created=parse_time(md.get("creationTimestamp")) or 0.0,
            ready_at=ready_at,
            message=message,
            endpoint=self._endpoint(claim, sandbox, ns, sb_name),
            resources=resources,
            user=(md.get("annotations") or {}).get(CLAIM_USER_ANNOTATION, ""),
        )

    def router_token(self, status: ClaimStatus) -> str | None:
        if not status.sandbox:
            return None
        return self._router_token(
            status.namespace, status.sandbox, status.labels.get(USER_LABEL, "")
        )

    def _router_token(self, ns: str, sb_name: str, user: str) -> str | None:
        """The hub token (router_auth jupyterhub) or a scoped token (router_auth token)."""
        if self.authority is not None:
            return self.authority.issue(Scope(ns, sb_name, user), ttl=self.token_ttl)
        return self.hub_token

    def _endpoint(
        self,
        claim: dict[str, Any],
        sandbox: dict[str, Any] | None,
        ns: str,
        sb_name: str | None,
    ) -> Endpoint | None:
        if not sb_name:
            return None
        if self.router_url:
            user = (claim["metadata"].get("labels") or {}).get(USER_LABEL, "")
            return Endpoint(
                router_url=self.router_url,
                namespace=ns,
                name=sb_name,
                port=self.port,
                token=self._router_token(ns, sb_name, user),
            )
        ips = ((sandbox or {}).get("status") or {}).get("podIPs") or []
        if not ips:
            return None
        ip = ips[0]
        host = f"[{ip}]" if ":" in ip else ip
        return Endpoint(
            router_url=f"http://{host}:{self.port}", namespace=ns, name=sb_name, port=self.port
        )
