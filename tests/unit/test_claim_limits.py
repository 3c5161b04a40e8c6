"""The claim service's per-user limits and the claims API's body checks, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_sandbox.claim_service.limits import ColdStartBudget, Limits, UserLimits
from jupyter_sandbox.control_plane.base import InvalidRequest, QuotaExceeded
from jupyter_sandbox.control_plane.http_api import claim_request_from_json
from jupyter_sandbox.utils.users import label_value


@pytest.mark.parametrize(
    ("max_claims", "held", "refused"),
    [(2, 0, False), (2, 1, False), (2, 2, True), (2, 5, True), (0, 500, False)],
)
def test_claims_held(max_claims: int, held: int, refused: bool) -> None:
    limits = UserLimits(Limits(max_claims_per_user=max_claims, cold_starts_per_minute=0))
    if refused:
        with pytest.raises(QuotaExceeded, match=f"at most {max_claims} per user"):
            limits.check_claim("alice", held, cold=True, now=0.0)
    else:
        limits.check_claim("alice", held, cold=True, now=0.0)


@pytest.mark.parametrize(
    ("per_minute", "takes", "expected"),
    [
        # (time of each attempt) -> which were allowed
        (2, [0, 0, 0], [True, True, False]),
        (2, [0, 0, 29, 30], [True, True, False, True]),  # one back every 30 s
        (1, [0, 59, 60, 61], [True, False, True, False]),
        (3, [0, 0, 0, 600, 600, 600, 600], [True] * 3 + [True] * 3 + [False]),  # capped at 3
    ],
)
def test_cold_start_budget(per_minute: float, takes: list[float], expected: list[bool]) -> None:
    budget = ColdStartBudget(per_minute)
    assert [budget.take("alice", float(t)) for t in takes] == expected


def test_cold_starts_are_counted_per_user_and_only_when_cold() -> None:
    limits = UserLimits(Limits(max_claims_per_user=0, cold_starts_per_minute=1))
    limits.check_claim("alice", 0, cold=True, now=0.0)
    limits.check_claim("bob", 0, cold=True, now=0.0)  # bob's budget is his own
    for _ in range(5):
        limits.check_claim("alice", 0, cold=False, now=1.0)  # warm claims cost nothing
    with pytest.raises(QuotaExceeded) as refused:
        limits.check_claim("alice", 0, cold=True, now=15.0)
    assert refused.value.hint == "try again in 45 s"
    assert refused.value.status == 429


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        Limits(max_claims_per_user=-1)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "pool is required"),
        ({"pool": ""}, "pool is required"),
        ({"pool": 3}, "pool is required"),
        ({"pool": "p", "owner": "bob"}, "unknown claim fields: owner"),
        ({"pool": "p", "labels": ["a"]}, "labels must be an object of strings"),
        ({"pool": "p", "labels": {"a": 1}}, "labels must be an object of strings"),
        ({"pool": "p", "env": {"A": None}}, "env must be an object of strings"),
        ({"pool": "p", "owner_pid": "1"}, "owner_pid must be an integer"),
        ({"pool": "p", "owner_pid": True}, "owner_pid must be an integer"),
        ({"pool": "p", "name": 5}, "name must be a string"),
        ({"pool": "p", "orphan_grace": "x"}, "orphan_grace must be a number"),
        ({"pool": "p", "server_name": ["x"]}, "server_name must be a string"),
    ],
)
def test_claim_bodies_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        claim_request_from_json(body)


def test_claim_body_accepted() -> None:
    request = claim_request_from_json(
        {"pool": "p", "labels": {"a": "b"}, "orphan_grace": 5, "server_name": "gpu"}
    )
    assert (request.pool, request.labels, request.orphan_grace) == ("p", {"a": "b"}, 5)
    assert (request.server_name, request.user, request.files_optional) == ("gpu", None, False)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("alice", "alice"),
        ("alice@example.org", "alice-example.org"),
        ("-x-", "x"),
        ("jürgen", "j-rgen"),
        ("", "unknown"),
        ("a" * 70, "a" * 63),
    ],
)
def test_label_value(name: str, label: str) -> None:
    assert label_value(name) == label
