"""Each sandbox's runtime token (protocol/runtime_auth.py): a Secret of its own, and
its runtime's environment variable referring to it.

The value never appears in the pod spec, which users may read; only the Secret holds
it, owned by the Sandbox so that it goes when the Sandbox does. A Secret of that
name the operator did not make is a conflict, never adopted: whoever made it would
know the token.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from ..kube.client import SECRET, ApiError
from ..protocol import runtime_auth
from .util import FIELD_MANAGER, controller_ref, is_controlled_by

if TYPE_CHECKING:
    from .manager import Operator


class TokenConflict(Exception):
    """A Secret of the token's name that is not this sandbox's."""


def _data(token: str) -> dict[str, str]:
    return {runtime_auth.SECRET_KEY: base64.b64encode(token.encode()).decode()}


async def ensure_token_secret(op: Operator, sandbox: dict, key: bytes) -> str:
    """Create (or bring up to date) the sandbox's token Secret; its name."""
    meta = sandbox["metadata"]
    ns, name = meta["namespace"], meta["name"]
    secret = runtime_auth.secret_name(name)
    data = _data(runtime_auth.token_for(key, ns, name, meta["uid"]))
    body = {
        "metadata": {"name": secret, "namespace": ns, "ownerReferences": [controller_ref(sandbox)]},
        "type": "Opaque",
        "data": data,
    }
    try:
        await op.client.create(SECRET, ns, body, fieldManager=FIELD_MANAGER)
        return secret
    except ApiError as e:
        if not e.already_exists:
            raise
    existing = await op.client.get(SECRET, ns, secret)
    if not is_controlled_by(existing, sandbox):
        raise TokenConflict(f"secret {secret} exists and is not this sandbox's")
    if existing.get("data") != data:  # the key was changed
        existing["data"] = data
        await op.client.replace(SECRET, existing)  # (its resourceVersion: no lost update)
    return secret


def give_runtime_token(pod_spec: dict, secret: str) -> None:
    """The sandbox's main container (the first, as for the user's volume) reads its
    token from the Secret, by reference."""
    containers = pod_spec.get("containers") or []
    if not containers:
        return
    main = containers[0]
    env = [e for e in main.get("env") or [] if e.get("name") != runtime_auth.ENV]
    env.append(
        {
            "name": runtime_auth.ENV,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": runtime_auth.SECRET_KEY}},
        }
    )
    main["env"] = env
