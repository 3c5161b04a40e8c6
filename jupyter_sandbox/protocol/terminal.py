"""The sandbox terminal's messages: terminado's JSON arrays, checked at both ends.

JupyterLab's terminal widget speaks this protocol (``["stdin", text]``,
``["set_size", rows, cols, ...]`` one way; ``["setup", {}]``, ``["stdout", text]``,
``["disconnect", code]`` the other). The runtime checks what a client sends; the
Jupyter server checks both directions, so that nothing but these shapes, within
these sizes, passes between a browser and a sandbox.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

# A paste arrives as one stdin message; output is sent in pieces of at most a read.
MAX_INPUT_CHARS = 1024 * 1024
MAX_OUTPUT_CHARS = 256 * 1024
# JSON escapes (\uXXXX) make a message up to six bytes per character.
MAX_INPUT_BYTES = 6 * MAX_INPUT_CHARS + 64
MAX_OUTPUT_BYTES = 6 * MAX_OUTPUT_CHARS + 64
MAX_ROWS = 1000
MAX_COLUMNS = 1000


class TerminalMessageError(ValueError):
    """A message that is not one of the protocol's (the reason says why)."""


@dataclass(frozen=True)
class Stdin:
    text: str


@dataclass(frozen=True)
class Resize:
    rows: int
    columns: int


@dataclass(frozen=True)
class Output:
    """What the sandbox's side says: ``kind`` is stdout, setup or disconnect."""

    kind: str
    text: str = ""


def _array(message: str | bytes, limit: int) -> list[object]:
    if isinstance(message, bytes):
        raise TerminalMessageError("terminal messages are text, not binary")
    if len(message) > limit:
        raise TerminalMessageError(f"a terminal message may be at most {limit} bytes")
    try:
        value = json.loads(message)
    except ValueError:
        raise TerminalMessageError("a terminal message must be JSON") from None
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise TerminalMessageError('a terminal message is a JSON array such as ["stdin", "ls\\r"]')
    return value


def _dimension(value: object, name: str, highest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= highest:
        raise TerminalMessageError(f"{name} must be a whole number from 1 to {highest}")
    return value


def parse_input(message: str | bytes) -> Stdin | Resize:
    """A client's message: keystrokes (or a paste) or the terminal's new size."""
    value = _array(message, MAX_INPUT_BYTES)
    kind = str(value[0])
    if kind == "stdin":
        if len(value) != 2 or not isinstance(value[1], str):
            raise TerminalMessageError('stdin is ["stdin", text]')
        if len(value[1]) > MAX_INPUT_CHARS:
            raise TerminalMessageError(f"stdin may be at most {MAX_INPUT_CHARS} characters")
        return Stdin(value[1])
    if kind == "set_size":
        if len(value) < 3:
            raise TerminalMessageError('set_size is ["set_size", rows, columns, ...]')
        rows = _dimension(value[1], "rows", MAX_ROWS)
        return Resize(rows, _dimension(value[2], "columns", MAX_COLUMNS))
    raise TerminalMessageError(f"unknown terminal message {kind[:40]!r}")


def accept_input(message: str | bytes, log: logging.Logger) -> Stdin | Resize | None:
    """``parse_input``, with a refused message logged and answered by None (ignored)."""
    try:
        return parse_input(message)
    except TerminalMessageError as exc:
        log.info("ignoring a terminal message: %s", exc)
        return None


def parse_output(message: str | bytes) -> Output:
    """A runtime's message, before the Jupyter server passes it to a browser."""
    value = _array(message, MAX_OUTPUT_BYTES)
    kind = str(value[0])
    if kind == "stdout":
        if len(value) != 2 or not isinstance(value[1], str):
            raise TerminalMessageError('stdout is ["stdout", text]')
        if len(value[1]) > MAX_OUTPUT_CHARS:
            raise TerminalMessageError(f"stdout may be at most {MAX_OUTPUT_CHARS} characters")
        return Output("stdout", value[1])
    if kind in ("setup", "disconnect"):
        return Output(kind)
    raise TerminalMessageError(f"unknown terminal message {kind[:40]!r}")


def encode_input(message: Stdin | Resize) -> str:
    if isinstance(message, Stdin):
        return json.dumps(["stdin", message.text])
    return json.dumps(["set_size", message.rows, message.columns])


def encode_output(message: Output) -> str:
    if message.kind == "stdout":
        return json.dumps(["stdout", message.text])
    if message.kind == "setup":
        return json.dumps(["setup", {}])
    return json.dumps(["disconnect", 1])
