"""Which failures of upstream's e2e tests count as the create-read-update race that
any controller can lose (tests/upstream_e2e/harness.py), table-driven."""

from __future__ import annotations

import pytest

from tests.upstream_e2e.harness import RACES, Outcome, _lost_race

TEST = "TestSandboxVolumeClaimTemplatesImmutable"
CONFLICT = (
    '\tError:      \t"Operation cannot be fulfilled on sandboxes.agents.x-k8s.io '
    '\\"vct-immutable\\": the object has been modified; please apply your changes to the '
    'latest version and try again" does not contain "volumeClaimTemplates is immutable"'
)
OTHER = '\tError:      \t"sandbox updated" does not contain "volumeClaimTemplates is immutable"'
CASES = {
    "the conflict alone": (False, f"=== RUN {TEST}\n{CONFLICT}\n--- FAIL: {TEST}", True),
    "the conflict and another failure": (False, f"{CONFLICT}\n{OTHER}\n--- FAIL", False),
    "another failure": (False, f"{OTHER}\n--- FAIL: {TEST}", False),
    "no error lines (a timeout, a crash)": (False, "panic: test timed out", False),
    "passed": (True, f"{CONFLICT}\n--- PASS: {TEST} ", False),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_only_the_named_conflict_counts_as_a_lost_race(case: str) -> None:
    passed, output, lost = CASES[case]
    outcome = Outcome(TEST, passed, 1.0, output)
    assert _lost_race(outcome, RACES[TEST]) is lost
