"""What a workspace is measured to hold: on-disk bytes, links never followed."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_over_and_missing(tmp_path: Path) -> None:
    assert measure(str(tmp_path / "missing")) == Usage(0, 0, True)
    assert Usage(10, 1, True).over(5) and not Usage(10, 1, True).over(10)
    assert not Usage(10, 1, True).over(None)
