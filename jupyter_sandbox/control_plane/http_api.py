"""The claims HTTP API's server side, shared by the local daemon and the claim service.

Both serve the same paths and bodies (``docs/rest-api.md``), so one client
(``control_plane/http_client.py``) speaks to either: a JSON body in, a
``ClaimStatus`` or ``{"items": [...]}`` out, and every refusal as a
``ClaimError``'s JSON (``reason``, ``message``, ``hint``) with its status.
"""

from __future__ import annotations

import json
from typing import Any

from tornado import web

from .base import ClaimError, ClaimRequest, InvalidRequest, Phase

MAX_WAIT = 600.0
CLAIM_FIELDS = frozenset(
    {
        "pool",
        "labels",
        "env",
        "owner_pid",
        "name",
        "orphan_grace",
        "files_dir",
        "files_optional",
        "server_name",
    }
)


class JsonHandler(web.RequestHandler):
    """JSON in, JSON out, and a ClaimError becomes its status and JSON body."""

    def body(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise InvalidRequest("request body is not JSON") from None
        if not isinstance(data, dict):
            raise InvalidRequest("request body must be a JSON object")
        return data

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ClaimError):
            body = exc.to_json()
        else:
            body = {"reason": "Error", "message": self._reason, "hint": ""}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, ClaimError):
            self.send_error(e.status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    def label_selector(self) -> dict[str, str]:
        """``?label=k=v&label=...`` as a dict."""
        selector = {}
        for item in self.get_query_arguments("label"):
            key, sep, value = item.partition("=")
            if not sep:
                raise InvalidRequest("label selectors look like key=value")
            selector[key] = value
        return selector

    def wait_arguments(self) -> tuple[set[Phase], float] | None:
        """``?wait=Ready[,Failed...]&timeout=S``: the phases and seconds, or None."""
        wait = self.get_query_argument("wait", None)
        if wait is None:
            return None
        phases = {Phase(p) for p in wait.split(",") if p in Phase._value2member_map_}
        if not phases:
            raise InvalidRequest(f"wait must name phases from {[p.value for p in Phase]}")
        try:
            timeout = float(self.get_query_argument("timeout", "60"))
        except ValueError:
            raise InvalidRequest("timeout must be a number") from None
        if not 0 < timeout <= MAX_WAIT:
            raise InvalidRequest(f"timeout must be in (0, {MAX_WAIT:g}] seconds")
        return phases, timeout


def _strings(name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(f"{name} must be an object of strings")
    return dict(value)


KINDS: dict[str, tuple[type, ...]] = {
    "an integer": (int,),
    "a string": (str,),
    "a number": (int, float),
}


def _optional(name: str, value: Any, kind: str) -> Any:
    if value is not None and (not isinstance(value, KINDS[kind]) or isinstance(value, bool)):
        raise InvalidRequest(f"{name} must be {kind}, not {value!r}")
    return value


def claim_request_from_json(body: dict[str, Any]) -> ClaimRequest:
    """The ``POST /api/claims`` body as a ClaimRequest; InvalidRequest names what is wrong."""
    unknown = set(body) - CLAIM_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown claim fields: {', '.join(sorted(unknown))}")
    pool = body.get("pool")
    if not isinstance(pool, str) or not pool:
        raise InvalidRequest("pool is required")
    return ClaimRequest(
        pool=pool,
        labels=_strings("labels", body.get("labels")),
        env=_strings("env", body.get("env")),
        owner_pid=_optional("owner_pid", body.get("owner_pid"), "an integer"),
        name=_optional("name", body.get("name"), "a string"),
        orphan_grace=_optional("orphan_grace", body.get("orphan_grace"), "a number"),
        files_dir=_optional("files_dir", body.get("files_dir"), "a string"),
        files_optional=body.get("files_optional") is True,
        server_name=_optional("server_name", body.get("server_name"), "a string"),
    )
