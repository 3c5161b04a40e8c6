"""A pool's limits as the daemon applies them (model.PoolSpec), table-driven:
a pool that names none gets the defaults, 0 lifts a liftable one."""

from __future__ import annotations

import pytest

from jupyter_sandbox.control_plane.base import InvalidRequest
from jupyter_sandbox.control_plane.local.model import (
    DEFAULT_DISK_MB,
    DEFAULT_MAX_PROCESSES,
    PoolSpec,
    default_memory_mb,
)

MB = 1024 * 1024
CASES = {
    "names nothing": ({}, default_memory_mb() * MB, DEFAULT_MAX_PROCESSES, DEFAULT_DISK_MB * MB),
    "names them": (
        {"memory_mb": 512, "max_processes": 50, "disk_mb": 100},
        512 * MB,
        50,
        100 * MB,
    ),
    "lifts them": ({"memory_mb": 0, "max_processes": 0, "disk_mb": 0}, None, None, None),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_limits_a_pool_gets(case: str) -> None:
    body, memory, processes, disk = CASES[case]
    spec = PoolSpec.from_json("p", body)
    assert spec.cgroup_memory_bytes() == memory
    assert spec.process_limit() == processes
    assert spec.disk_limit_bytes() == disk


def test_the_default_memory_limit_is_at_most_half_the_machine() -> None:
    import psutil

    assert 0 < default_memory_mb() <= psutil.virtual_memory().total // (2 * MB)


@pytest.mark.parametrize(
    "body",
    [
        {"memory_mb": -1},
        {"max_processes": -5},
        {"disk_mb": -1},
        {"disk_mb": 1.5},
        {"tmp_mb": 0},
        {"cpu_seconds": 0},
    ],
)
def test_only_liftable_limits_take_zero_and_none_a_negative(body: dict) -> None:
    with pytest.raises(InvalidRequest, match="must be a positive integer"):
        PoolSpec.from_json("p", body)
