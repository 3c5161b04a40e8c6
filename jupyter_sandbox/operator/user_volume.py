"""The user's own volume in a claimed sandbox (e.g. zero-to-jupyterhub's ``claim-<user>``).

A SandboxTemplate annotated ``jupyter-sandbox/user-volume-path: /home/jovyan`` has
every claim on its pools mount the claiming user's existing PersistentVolumeClaim
at that path, so a kernel sees the notebook's files at the same absolute path as
the user's Jupyter server does. This is an extension of ours; upstream's
controller ignores the annotation (its claims then get no user volume).

Which volume is the user's is decided here, never by the claim: the PVC in the
claim's namespace annotated ``hub.jupyter.org/username`` (KubeSpawner writes it on
every PVC it makes) with exactly the name in the claim's ``jupyter-sandbox/user``
annotation. The router admits a hub user only to sandboxes whose claim carries
that same annotation, so whoever can reach the sandbox is the owner of the volume
mounted in it: a claim that names another user gets that user's volume in a
sandbox only that user can reach.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ..runtime.paths import (
    GUARD_HOME_ENV,
    KERNEL_CWD_ENV,
    PACKAGES_DIR_ENV,
    USER_PACKAGES_SUBDIR,
    project_key,
)

USER_VOLUME_PATH_ANNOTATION = "jupyter-sandbox/user-volume-path"
USER_VOLUME_READ_ONLY_ANNOTATION = "jupyter-sandbox/user-volume-read-only"
# On the claim (written by the Kubernetes backend of the kernel provisioner); the
# router admits a hub user only to sandboxes whose claim names them.
CLAIM_USER_ANNOTATION = "jupyter-sandbox/user"
CLAIM_SERVER_ANNOTATION = "jupyter-sandbox/server-name"
CLAIM_KERNEL_CWD_ANNOTATION = "jupyter-sandbox/kernel-cwd"
# On the PVC (written by KubeSpawner).
HUB_USERNAME_ANNOTATION = "hub.jupyter.org/username"
HUB_SERVERNAME_ANNOTATION = "hub.jupyter.org/servername"

VOLUME_NAME = "jupyter-sandbox-user-files"
SHARED_ACCESS_MODES = frozenset({"ReadWriteMany", "ReadOnlyMany"})


class UserVolumeError(Exception):
    """The claim cannot get its user's volume; the message says why and what to do."""


@dataclass(frozen=True)
class UserVolume:
    path: str
    read_only: bool


def user_volume_of(template: dict) -> UserVolume | None:
    """The template's user-volume setting, or None when it has none."""
    annotations = template.get("metadata", {}).get("annotations") or {}
    path = annotations.get(USER_VOLUME_PATH_ANNOTATION)
    if path is None:
        return None
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or path == "/":
        raise UserVolumeError(
            f"{USER_VOLUME_PATH_ANNOTATION} must be an absolute, normalized path other than /,"
            f" not {path!r}"
        )
    read_only = annotations.get(USER_VOLUME_READ_ONLY_ANNOTATION, "false").lower()
    if read_only not in ("true", "false"):
        raise UserVolumeError(
            f"{USER_VOLUME_READ_ONLY_ANNOTATION} must be 'true' or 'false', not {read_only!r}"
        )
    return UserVolume(path.rstrip("/"), read_only == "true")


def choose_user_pvc(pvcs: list[dict], user: str | None, server: str | None) -> dict:
    """The PVC of ``user`` (and of their ``server``, when they have several)."""
    if not user:
        raise UserVolumeError(
            f"the claim names no user (annotation {CLAIM_USER_ANNOTATION}), so no user volume"
            " can be chosen for it"
        )
    theirs = [
        p
        for p in pvcs
        if not p["metadata"].get("deletionTimestamp")
        and (p["metadata"].get("annotations") or {}).get(HUB_USERNAME_ANNOTATION) == user
    ]
    if not theirs:
        raise UserVolumeError(
            f"no PersistentVolumeClaim is annotated {HUB_USERNAME_ANNOTATION}={user!r}"
            " in this namespace (JupyterHub's KubeSpawner makes it at the user's first start)"
        )
    if len(theirs) == 1:
        return theirs[0]
    wanted = server or ""
    same_server = [
        p
        for p in theirs
        if (p["metadata"].get("annotations") or {}).get(HUB_SERVERNAME_ANNOTATION, "") == wanted
    ]
    if len(same_server) == 1:
        return same_server[0]
    names = ", ".join(sorted(p["metadata"]["name"] for p in theirs))
    raise UserVolumeError(
        f"user {user!r} has several PersistentVolumeClaims ({names}) and none is the only one"
        f" of server {wanted!r}"
    )


def attaches_anywhere(pvc: dict) -> bool:
    """A shared access mode: the volume can be mounted on any node, beside other pods."""
    return bool(set(pvc.get("spec", {}).get("accessModes") or []) & SHARED_ACCESS_MODES)


def node_to_share(pvc: dict, pods: list[dict]) -> str | None:
    """The node a ReadWriteOnce volume is attached to now (the sandbox must go there).

    None when the volume can be attached anywhere (a shared access mode) or is not
    in use. A ReadWriteOncePod volume cannot be shared with a running pod at all.
    """
    if attaches_anywhere(pvc):
        return None
    name = pvc["metadata"]["name"]
    users = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and any(
            (v.get("persistentVolumeClaim") or {}).get("claimName") == name
            for v in p.get("spec", {}).get("volumes") or []
        )
    ]
    if not users:
        return None
    if "ReadWriteOncePod" in (pvc.get("spec", {}).get("accessModes") or []):
        raise UserVolumeError(
            f"PersistentVolumeClaim {name!r} is ReadWriteOncePod and in use by pod"
            f" {users[0]['metadata']['name']!r}: it cannot be shared with a sandbox"
        )
    nodes = {p.get("spec", {}).get("nodeName") for p in users} - {None, ""}
    if len(nodes) > 1:  # cannot happen for ReadWriteOnce; refuse rather than guess
        raise UserVolumeError(f"PersistentVolumeClaim {name!r} is in use on several nodes")
    return next(iter(nodes), None)


def kernel_cwd(claim: dict, volume: UserVolume) -> str:
    """Where the kernel starts: the notebook's directory when it is on the volume."""
    wanted = (claim.get("metadata", {}).get("annotations") or {}).get(CLAIM_KERNEL_CWD_ANNOTATION)
    if wanted and wanted.startswith("/"):
        wanted = posixpath.normpath(wanted)
        if wanted == volume.path or wanted.startswith(volume.path + "/"):
            return wanted
    return volume.path


def packages_dir(volume: UserVolume, cwd: str) -> str:
    """Where the project in ``cwd`` keeps its %pip packages, across its kernels."""
    return posixpath.join(volume.path, USER_PACKAGES_SUBDIR, project_key(cwd))


def attach(pod_spec: dict, pvc_name: str, volume: UserVolume, cwd: str, node: str | None) -> None:
    """Mount the PVC at the volume's path in the first container; pin to ``node``."""
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != VOLUME_NAME]
    volumes.append(
        {
            "name": VOLUME_NAME,
            "persistentVolumeClaim": {"claimName": pvc_name, "readOnly": volume.read_only},
        }
    )
    pod_spec["volumes"] = volumes
    containers = pod_spec.get("containers") or []
    if not containers:
        raise UserVolumeError("the template's pod has no container to mount the user volume in")
    main = containers[0]
    mounts = [m for m in main.get("volumeMounts") or [] if m.get("mountPath") != volume.path]
    mounts.append({"name": VOLUME_NAME, "mountPath": volume.path, "readOnly": volume.read_only})
    main["volumeMounts"] = mounts
    ours = {KERNEL_CWD_ENV, PACKAGES_DIR_ENV, GUARD_HOME_ENV}
    env = [e for e in main.get("env") or [] if e.get("name") not in ours]
    env.append({"name": KERNEL_CWD_ENV, "value": cwd})
    if not volume.read_only:
        # %pip packages stay with the project, on the user's volume
        env.append({"name": PACKAGES_DIR_ENV, "value": packages_dir(volume, cwd)})
        # and nothing their own server or shells would run can be written there
        env.append({"name": GUARD_HOME_ENV, "value": volume.path})
    main["env"] = env
    if node:
        pin = {"key": "metadata.name", "operator": "In", "values": [node]}
        required = (
            pod_spec.setdefault("affinity", {})
            .setdefault("nodeAffinity", {})
            .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        )
        # Terms are ORed: the node requirement joins every existing term.
        required["nodeSelectorTerms"] = [
            {**t, "matchFields": [*(t.get("matchFields") or []), pin]}
            for t in required.get("nodeSelectorTerms") or [{}]
        ]
