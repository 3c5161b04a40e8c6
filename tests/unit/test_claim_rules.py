"""Pure rules of the SandboxClaim reconciler: volume claim template checks (with
upstream's wording) and the first-observed timestamp format."""

from __future__ import annotations

import pytest

from jupyter_sandbox.kube.times import rfc3339_nano
from jupyter_sandbox.operator.claim import ClaimRejected, validate_claim


def _vct(name: str | None) -> dict:
    return {"metadata": {"name": name} if name else {}, "spec": {}}


def _template(policy: str | None, *names: str) -> dict:
    spec: dict = {"volumeClaimTemplates": [_vct(n) for n in names]}
    if policy:
        spec["volumeClaimTemplatesPolicy"] = policy
    return {"spec": spec}


def _claim(*names: str | None) -> dict:
    return {"spec": {"volumeClaimTemplates": [_vct(n) for n in names]}}


@pytest.mark.parametrize(
    ("template", "claim", "message"),
    [
        (_template("Allowed", "workspace"), _claim("data"), None),
        (_template("Overrides", "workspace"), _claim("workspace"), None),
        (_template("Disallowed"), _claim(), None),  # no claim templates: nothing to check
        (_template(None), _claim("data"), "disallowed by the template"),
        (_template("Disallowed"), _claim("data"), "disallowed by the template"),
        (_template("Allowed", "workspace"), _claim("workspace"), "cannot override template"),
        (_template("Allowed"), _claim("data", "data"), "claim: invalid volume claim templates"),
        (_template("Overrides"), _claim("a", "b", "a"), "duplicate name 'a'"),
        (_template("Allowed"), _claim(None), "name at index 0 is empty"),
        (_template("Allowed"), _claim("a", None), "name at index 1 is empty"),
        (_template("Allowed", "w", "w"), _claim("data"), "template: invalid"),
    ],
)
def test_volume_claim_templates_are_checked_like_upstream(template, claim, message):
    if message is None:
        validate_claim(claim, template)
        return
    with pytest.raises(ClaimRejected) as err:
        validate_claim(claim, template)
    assert err.value.reason == "VolumeClaimTemplatesError"
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("ns", "expected"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_796_409_541_123_456_789, "2026-12-04T18:39:01.123456789Z"),
        (1_796_409_541_120_000_000, "2026-12-04T18:39:01.12Z"),
        (1_796_409_541_000_000_001, "2026-12-04T18:39:01.000000001Z"),
    ],
)
def test_first_observed_times_are_go_rfc3339_nano(ns, expected):
    assert rfc3339_nano(ns) == expected
