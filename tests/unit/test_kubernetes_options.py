"""The Kubernetes backend's options: typed once, refused by name when wrong."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_sandbox.control_plane.base import InvalidRequest
from jupyter_sandbox.control_plane.kubernetes.options import OPTIONS, parse_options


def test_left_out_options_get_their_defaults() -> None:
    typed = parse_options({})
    assert set(typed) == set(OPTIONS)
    assert typed["port"] == 8888 and typed["save_state"] is True
    assert typed["namespace"] is None and typed["in_cluster"] is None


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"port": "9000"}, {"port": 9000}),
        ({"port": 9000}, {"port": 9000}),
        ({"request_timeout": "2.5"}, {"request_timeout": 2.5}),
        ({"save_state": "false"}, {"save_state": False}),
        ({"save_state": "Yes"}, {"save_state": True}),
        ({"save_state": False}, {"save_state": False}),
        ({"in_cluster": "1"}, {"in_cluster": True}),
        ({"in_cluster": "off"}, {"in_cluster": False}),
        ({"state_max_mb": "256"}, {"state_max_mb": 256}),
        ({"namespace": ""}, {"namespace": None}),
        ({"router_auth": "jupyterhub"}, {"router_auth": "jupyterhub"}),
        ({"save_state": None}, {"save_state": True}),
    ],
)
def test_strings_from_json_or_config_become_typed_values(
    given: dict[str, Any], expected: dict[str, Any]
) -> None:
    typed = parse_options(given)
    assert {name: typed[name] for name in expected} == expected


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"prot": 9000}, "unknown kubernetes backend option: prot"),
        ({"a": 1, "b": 2}, "unknown kubernetes backend options: a, b"),
        ({"port": "http"}, "port must be an integer from 1 to 65535, not 'http'"),
        ({"port": 0}, "port must be an integer from 1 to 65535"),
        ({"port": 70000}, "port must be an integer from 1 to 65535"),
        ({"port": 8.5}, "port must be an integer"),
        ({"port": True}, "port must be an integer"),
        ({"max_connections": 1}, "max_connections must be an integer of at least 4"),
        ({"request_timeout": "-1"}, "request_timeout must be a number"),
        ({"save_state": "maybe"}, "save_state must be true or false, not 'maybe'"),
        ({"in_cluster": 2}, "in_cluster must be true or false"),
        ({"namespace": 7}, "namespace must be a string, not 7"),
        ({"router_auth": "hub"}, "router_auth must be one of token, jupyterhub, none"),
    ],
)
def test_wrong_options_are_refused_by_name(given: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_options(given)
    assert words in str(caught.value.message)
