"""What the write guard of a bound notebook directory costs a kernel.

Every file a sandboxed kernel opens for writing is stopped and handed to the
guard (runtime/write_guard.py): in the notebook's directory the guard opens it
itself; elsewhere (the sandbox's /tmp, its workspace) it lets the call go on.
Both cost a round trip to the guard. Measured inside the kernel, against a plain
ipykernel doing the same in the same directory.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from .kernels import PLAIN, SANDBOX_FILES, start_ready, stop
from .stats import Figure, Series

FILES = 500
WRITE_FILES = """
import json, os, tempfile, time
def files(where, n={n}):
    os.makedirs(where, exist_ok=True)
    started = time.perf_counter()
    for i in range(n):
        with open(os.path.join(where, f"f{{i}}.txt"), "w") as f:
            f.write("x")
    return (time.perf_counter() - started) / n * 1e6
print(json.dumps({{"here": files("bench-guard"), "elsewhere": files(tempfile.mkdtemp())}}))
"""


async def _per_file_us(kc: Any) -> dict[str, float]:
    lines: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            lines.append(msg["content"]["text"])

    reply = await kc.execute_interactive(WRITE_FILES.format(n=FILES), timeout=120, output_hook=hook)
    assert reply["content"]["status"] == "ok", reply["content"]
    return dict(json.loads("".join(lines).strip().splitlines()[-1]))


async def file_writes(reps: int) -> list[Figure]:
    here = (Series("sandbox, guarded", "us"), Series("plain ipykernel", "us"))
    elsewhere = (Series("sandbox, let through", "us"), Series("plain ipykernel", "us"))
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as folder:
        _, skm, skc = await start_ready(SANDBOX_FILES, cwd=folder)
        _, pkm, pkc = await start_ready(PLAIN, cwd=folder)
        try:
            for _ in range(reps):
                for index, kc in enumerate((skc, pkc)):
                    figures = await _per_file_us(kc)
                    here[index].values.append(figures["here"])
                    elsewhere[index].values.append(figures["elsewhere"])
        finally:
            await stop(skm, skc)
            await stop(pkm, pkc)
    return [
        Figure(
            f"create and write a file next to the notebook (per file, {FILES} files)",
            *here,
            "none set",
            notes="the guard opens each file for the kernel after checking its name",
        ),
        Figure(
            f"create and write a file in the sandbox's /tmp (per file, {FILES} files)",
            *elsewhere,
            "none set",
            notes="the guard looks at each call and lets it go on",
        ),
    ]
