"""Upstream's e2e suite against our operator and, for comparison, upstream's
controller, each on a fresh control plane:

    python -m tests.upstream_e2e                     # both controllers, the table
    python -m tests.upstream_e2e --controller ours   # one controller
    python -m tests.upstream_e2e -k Suspension       # only matching tests
    python -m tests.upstream_e2e --check             # CI: fail if ours fails a test
                                                     # that upstream's controller passes
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from .harness import VERSION, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.upstream_e2e")
    p.add_argument("--controller", choices=["ours", "upstream", "both"], default="both")
    p.add_argument("-k", dest="only", default=None, help="regex of test names")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if our operator fails a test that upstream's controller passes "
        "(with --controller ours: any failure)",
    )
    args = p.parse_args(argv)
    # stopped (CI timeout, Ctrl-C from a wrapper): still stop the control planes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    controllers = ["ours", "upstream"] if args.controller == "both" else [args.controller]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="upstream-e2e-"))
    results = {c: run(c, workdir / c, args.only) for c in controllers}
    print(f"\nagent-sandbox {VERSION} e2e suites (logs in {workdir})")
    print("| suite | test | " + " | ".join(controllers) + " |")
    print("|---|---|" + "---|" * len(controllers))
    first = results[controllers[0]]
    for suite, outcomes in first.items():
        for i, outcome in enumerate(outcomes):
            cells = []
            for c in controllers:
                o = results[c][suite][i]
                cells.append(f"{'pass' if o.passed else 'FAIL'} ({o.seconds:.0f} s)")
            print(f"| {suite} | {outcome.test} | " + " | ".join(cells) + " |")
    for c in controllers:
        total = [o for outcomes in results[c].values() for o in outcomes]
        print(f"{c}: {sum(o.passed for o in total)} of {len(total)} pass")
    if not args.check or "ours" not in results:
        return 0
    passed = {c: {o.test for v in results[c].values() for o in v if o.passed} for c in results}
    ran = {o.test for v in results["ours"].values() for o in v}
    expected = passed.get("upstream", ran)
    regressions = sorted((expected & ran) - passed["ours"])
    if regressions:
        print(f"FAILED: our operator fails {', '.join(regressions)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
