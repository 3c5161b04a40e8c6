"""The Kubernetes backend's options, checked and typed.

They arrive from a kernelspec's ``backend_options`` (JSON) or from Jupyter
configuration, so numbers and booleans may come as strings.  Each is converted
here once, and anything unknown or out of range is refused with the option's
name, what it must be and what it was, instead of a bare ``ValueError`` later
or a silent default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..base import InvalidRequest

ROUTER_AUTH_MODES = ("token", "jupyterhub", "none")
RUNTIME_PORT = 8888  # where the runtime listens in its pod
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _text(name: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"backend option {name} must be a string, not {value!r}")
    return value


def _flag(name: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise InvalidRequest(
        f"backend option {name} must be true or false, not {value!r}",
        hint=f"use a JSON boolean, or one of {', '.join(TRUE_WORDS + FALSE_WORDS)}",
    )


def _number(kind: type, low: float, high: float | None = None) -> Callable[[str, Any], Any]:
    def convert(name: str, value: Any) -> Any:
        number = None
        # bool is an int to Python, and int(8.5) is 8: neither is a number here
        fractional = kind is int and isinstance(value, float) and not value.is_integer()
        if not isinstance(value, bool) and not fractional:
            try:
                number = kind(value)
            except (TypeError, ValueError):
                pass
        if number is None or number < low or (high is not None and number > high):
            bound = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"
            what = "an integer" if kind is int else "a number"
            raise InvalidRequest(f"backend option {name} must be {what} {bound}, not {value!r}")
        return number

    return convert


def _router_auth(name: str, value: Any) -> str | None:
    value = _text(name, value)
    if value is not None and value not in ROUTER_AUTH_MODES:
        raise InvalidRequest(
            f"router_auth must be one of {', '.join(ROUTER_AUTH_MODES)}, not {value!r}"
        )
    return value


# name -> (converter, default); the defaults are those of an option left out
OPTIONS: dict[str, tuple[Callable[[str, Any], Any], Any]] = {
    "namespace": (_text, None),
    "claim_service_url": (_text, None),
    "router_url": (_text, None),
    "router_auth": (_router_auth, None),
    "token_secret_file": (_text, None),
    "token_secret": (_text, None),
    "kubeconfig": (_text, None),
    "context": (_text, None),
    "in_cluster": (_flag, None),
    "owner": (_text, None),
    "port": (_number(int, 1, 65535), RUNTIME_PORT),
    "request_timeout": (_number(float, 0.001), 30.0),
    "max_connections": (_number(int, 4), 256),
    "token_ttl": (_number(float, 1), 7 * 24 * 3600.0),
    "save_state": (_flag, True),
    "state_max_mb": (_number(int, 1), 1024),
    "state_timeout": (_number(float, 0.001), 60.0),
}


def parse_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every option, typed: the given ones checked, the others at their defaults."""
    unknown = sorted(set(raw) - set(OPTIONS))
    if unknown:
        raise InvalidRequest(
            f"unknown kubernetes backend option{'s' if len(unknown) > 1 else ''}: "
            + ", ".join(unknown),
            hint="known options: " + ", ".join(OPTIONS),
        )
    typed: dict[str, Any] = {}
    for name, (convert, default) in OPTIONS.items():
        value = raw.get(name)
        typed[name] = default if value is None else convert(name, value)
    return typed
