"""A claim error is logged once, as one line with its hint; other errors keep their traceback."""

from __future__ import annotations

import logging

import pytest

from jupyter_sandbox.control_plane.base import ClaimError, InvalidRequest, PoolNotFound
from jupyter_sandbox.kernel_provisioner import log_filter


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (
            PoolNotFound("pool 'x' does not exist", hint="create it"),
            "pool 'x' does not exist (create it)",
        ),
        (InvalidRequest("bad"), "bad"),
        (ClaimError("failed", hint=""), "failed"),
    ],
)
def test_the_hint_is_part_of_the_message(error: ClaimError, text: str) -> None:
    assert str(error) == text


def _logged(records: list[logging.LogRecord], *errors: BaseException) -> list[logging.LogRecord]:
    logger = logging.getLogger(f"test-claim-log-{id(records)}")
    logger.propagate = False
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    log_filter.install(logger)
    log_filter.install(logger)  # twice: still one filter
    assert len(logger.filters) == 1
    for error in errors:
        try:
            raise error
        except BaseException as exc:
            logger.exception(exc)
    return records


def test_a_claim_error_logged_twice_gives_one_line_without_traceback() -> None:
    error = PoolNotFound("pool 'x' does not exist", hint="create it with: x")
    records = _logged([], error, error)
    assert len(records) == 1
    assert records[0].exc_info is None
    assert records[0].getMessage() == (
        "Sandbox kernel did not start: pool 'x' does not exist (create it with: x)"
    )


def test_two_different_claim_errors_are_both_logged() -> None:
    records = _logged([], PoolNotFound("one"), PoolNotFound("two"))
    assert [r.getMessage() for r in records] == [
        "Sandbox kernel did not start: one",
        "Sandbox kernel did not start: two",
    ]


def test_other_errors_keep_their_traceback() -> None:
    records = _logged([], RuntimeError("boom"), RuntimeError("boom"))
    assert len(records) == 2
    assert all(r.exc_info is not None for r in records)
