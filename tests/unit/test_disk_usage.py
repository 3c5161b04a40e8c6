"""What a workspace is measured to hold: on-disk bytes, links never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.local.disk_usage import Usage, measure

MB = 1 << 20


def test_counts_what_is_on_disk(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(os.urandom(2 * MB))
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "more").write_bytes(os.urandom(MB))
    usage = measure(str(tmp_path))
    assert 3 * MB <= usage.bytes < 3 * MB + 256 * 1024 and usage.complete


def test_a_sparse_file_costs_what_it_holds(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(8 << 30)
    assert measure(str(tmp_path)).bytes < MB


def test_links_are_not_followed_and_hard_links_count_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(4 * MB))
    inside = tmp_path / "workspace"
    inside.mkdir()
    (inside / "to-outside").symlink_to(outside)
    (inside / "to-big").symlink_to(outside / "big")
    (inside / "one").write_bytes(os.urandom(MB))
    for i in range(10):
        os.link(inside / "one", inside / f"again{i}")
    usage = measure(str(inside))
    assert MB <= usage.bytes < 2 * MB


def test_the_walk_stops_at_its_bound_and_says_so(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    usage = measure(str(tmp_path), max_entries=20)
    assert not usage.complete and usage.over(1 << 40)
    assert measure(str(tmp_path), max_entries=100).complete


def test_a_missing_workspace_holds_nothing(tmp_path: Path) -> None:
    assert measure(str(tmp_path / "missing")) == Usage(0, 0, True)


@pytest.mark.parametrize(
    ("usage", "limit", "over"),
    [
        (Usage(10, 1, True), 5, True),
        (Usage(10, 1, True), 10, False),
        (Usage(10, 1, True), None, False),
        (Usage(10, 1, False), 100, True),  # the walk gave up: too many files
        (Usage(9, 1, True, full=True), 10, True),  # an image with no room left
        (Usage(9, 1, True, full=True), None, False),
    ],
)
def test_over_a_limit(usage: Usage, limit: int | None, over: bool) -> None:
    assert usage.over(limit) is over
