"""Log a sandbox claim's failure once, as one line, in the Jupyter server's log.

jupyter_client and jupyter_server each log a failed kernel start with its
traceback, so a missing pool filled the log with two copies of a traceback whose
last line did not even say what to do. A claim error is an explained failure (its
message and hint say it all): the first record keeps the message, without the
traceback, and the repeats are dropped. Any other exception logs as before.
"""

from __future__ import annotations

import logging
from collections import deque

from ..control_plane.base import ClaimError


class ClaimErrorLogFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        # Exceptions cannot be weakly referenced: keep the last few, to recognise repeats.
        self._seen: deque[BaseException] = deque(maxlen=32)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, ClaimError):
            return True
        if any(seen is exc for seen in self._seen):
            return False
        self._seen.append(exc)
        record.msg, record.args = "Sandbox kernel did not start: %s", (exc,)
        record.exc_info = None
        record.exc_text = None
        return True


def install(log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Add the filter to ``log`` once."""
    logger = log.logger if isinstance(log, logging.LoggerAdapter) else log
    if not any(isinstance(f, ClaimErrorLogFilter) for f in logger.filters):
        logger.addFilter(ClaimErrorLogFilter())
