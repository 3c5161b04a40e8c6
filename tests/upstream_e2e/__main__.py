"""Upstream's e2e suite against our operator and, for comparison, upstream's
controller, each on a fresh control plane:

    python -m tests.upstream_e2e                     # both controllers, the table
    python -m tests.upstream_e2e --controller ours   # one controller
    python -m tests.upstream_e2e -k Suspension       # only matching tests
    python -m tests.upstream_e2e --check             # CI: fail if ours fails a test
                                                     # that upstream's controller passes
    python -m tests.upstream_e2e --record            # run upstream's controller and
                                                     # write its results for --check
    python -m tests.upstream_e2e --build-only        # compile the suites (no packages needed)
    python -m tests.upstream_e2e --writes 20         # each controller's writes to a new
                                                     # Sandbox, and what a client's update meets

Upstream's controller does not change between our commits, so what it passes at a
given upstream version is recorded once (``results/<version>.json``, written by
``--record``) and ``--check`` compares our operator against that record. Without a
record for the pinned version (a version bump), ``--check`` runs upstream's
controller too, as before, and writes the record it would commit into the workdir.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from .build import VERSION, build_suites, build_upstream_controller

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def record_path(version: str = VERSION) -> Path:
    return RESULTS_DIR / f"{version}.json"


def load_record(version: str = VERSION) -> set[str] | None:
    """The tests upstream's controller passed at ``version``, if recorded."""
    path = record_path(version)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("version") != version or data.get("controller") != "upstream":
        raise ValueError(f"{path}: not upstream's results for {version}")
    return set(data["passed"])


def write_record(path: Path, results: dict) -> None:
    outcomes = [o for v in results.values() for o in v]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "version": VERSION,
                "controller": "upstream",
                "passed": sorted(o.test for o in outcomes if o.passed),
                "failed": sorted(o.test for o in outcomes if not o.passed),
            },
            indent=1,
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.upstream_e2e")
    p.add_argument("--controller", choices=["ours", "upstream", "both"], default=None)
    p.add_argument("-k", dest="only", default=None, help="regex of test names")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if our operator fails a test that upstream's controller passes "
        "(by its record for this version when there is one)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="run upstream's controller and write its results to results/<version>.json",
    )
    p.add_argument("--build-only", action="store_true", help="compile the suites and stop")
    p.add_argument(
        "--writes",
        type=int,
        metavar="N",
        default=0,
        help="create N Sandboxes per controller and show what each controller writes",
    )
    args = p.parse_args(argv)
    record = None if args.record else load_record()
    if args.build_only:
        build_suites()
        if record is None:
            build_upstream_controller()
        return 0
    if args.controller is not None:
        controllers = ["ours", "upstream"] if args.controller == "both" else [args.controller]
    elif args.record:
        controllers = ["upstream"]
    elif args.check and record is not None:
        controllers = ["ours"]
    else:
        controllers = ["ours", "upstream"]

    from .harness import run  # needs the test dependencies; --build-only does not

    # stopped (CI timeout, Ctrl-C from a wrapper): still stop the control planes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="upstream-e2e-"))
    if args.writes:
        from .writes import measure, report

        both = ["ours", "upstream"] if args.controller in (None, "both") else [args.controller]
        report({c: measure(c, workdir / f"writes-{c}", args.writes) for c in both})
        return 0
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
                race = f", {o.races_lost} lost race" if o.races_lost else ""
                cells.append(f"{'pass' if o.passed else 'FAIL'} ({o.seconds:.0f} s{race})")
            print(f"| {suite} | {outcome.test} | " + " | ".join(cells) + " |")
    for c in controllers:
        total = [o for outcomes in results[c].values() for o in outcomes]
        print(f"{c}: {sum(o.passed for o in total)} of {len(total)} pass")
    if "upstream" in results and not args.only:
        out = record_path() if args.record else workdir / record_path().name
        write_record(out, results["upstream"])
        print(f"upstream's results for {VERSION} written to {out}")
    if not args.check or "ours" not in results:
        return 0
    passed = {c: {o.test for v in results[c].values() for o in v if o.passed} for c in results}
    ran = {o.test for v in results["ours"].values() for o in v}
    if "upstream" in passed:
        expected = passed["upstream"]
    elif record is not None:
        expected = record
        print(f"upstream's controller: {len(record)} tests passed at {VERSION} (recorded)")
    else:
        expected = ran
    regressions = sorted((expected & ran) - passed["ours"])
    if regressions:
        print(f"FAILED: our operator fails {', '.join(regressions)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
