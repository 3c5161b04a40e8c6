"""How much disk a workspace takes: what the daemon watches against a pool's ``disk_mb``.

The sandbox writes the tree, so the walk trusts nothing in it: no link is
followed, nothing on another filesystem is counted, each inode counts once
(hard links), and a sparse file counts what it holds on disk, not its length.
The walk stops after ``max_entries`` (a sandbox could make millions of empty
files to make the daemon spin) and says so: at that point the tree is big in
another way and is reported as over the limit.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

MAX_ENTRIES = 1_000_000


@dataclass(frozen=True)
class Usage:
    bytes: int
    entries: int
    complete: bool  # False: the walk stopped at max_entries
    full: bool = False  # an image that enforces the limit has (almost) no room left

    def over(self, limit_bytes: int | None) -> bool:
        if limit_bytes is None:
            return False
        return self.bytes > limit_bytes or not self.complete or self.full


def measure(root: str, max_entries: int = MAX_ENTRIES) -> Usage:
    """The bytes allocated under ``root`` (``st_blocks``), walking without following links."""
    try:
        top = os.lstat(root)
    except OSError:
        return Usage(0, 0, True)
    if not stat.S_ISDIR(top.st_mode):
        return Usage(top.st_blocks * 512, 1, True)
    seen: set[tuple[int, int]] = set()
    total, entries = top.st_blocks * 512, 1
    stack = [root]
    while stack:
        path = stack.pop()
        try:
            scan = os.scandir(path)
        except OSError:  # gone, or not ours to read: nothing to count
            continue
        with scan:
            for entry in scan:
                entries += 1
                if entries > max_entries:
                    return Usage(total, entries, False)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_dev != top.st_dev:
                    continue  # a mount point: another filesystem's business
                if info.st_nlink > 1:
                    key = (info.st_dev, info.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return Usage(total, entries, True)
