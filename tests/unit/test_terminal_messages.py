"""The sandbox terminal's messages, checked at the runtime and at the Jupyter server."""

from __future__ import annotations

import json

import pytest

from jupyter_sandbox.protocol import terminal as messages
from jupyter_sandbox.protocol.terminal import Output, Resize, Stdin, TerminalMessageError


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('["stdin", "ls\\r"]', Stdin("ls\r")),
        ('["stdin", ""]', Stdin("")),
        ('["set_size", 24, 80, 400, 600]', Resize(24, 80)),
        ('["set_size", 1000, 1]', Resize(1000, 1)),
    ],
)
def test_a_client_message_is_read(raw: str, expected: object) -> None:
    assert messages.parse_input(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'["stdin", "x"]', "text, not binary"),
        ("not json", "must be JSON"),
        ('{"stdin": "x"}', "JSON array"),
        ("[]", "JSON array"),
        ("[1, 2]", "JSON array"),
        ('["stdin"]', "stdin is"),
        ('["stdin", 5]', "stdin is"),
        ('["stdin", "a", "b"]', "stdin is"),
        ('["set_size", 24]', "set_size is"),
        ('["set_size", 0, 80]', "rows must be"),
        ('["set_size", 24, 1001]', "columns must be"),
        ('["set_size", true, 80]', "rows must be"),
        ('["set_size", 24.5, 80]', "rows must be"),
        ('["shell", "rm -rf /"]', "unknown terminal message"),
        (json.dumps(["stdin", "x" * (messages.MAX_INPUT_CHARS + 1)]), "at most"),
        ("[" + " " * messages.MAX_INPUT_BYTES + '"stdin", ""]', "at most"),
    ],
)
def test_a_bad_client_message_is_refused_with_the_reason(raw: str | bytes, reason: str) -> None:
    with pytest.raises(TerminalMessageError, match=reason):
        messages.parse_input(raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('["stdout", "hi\\r\\n"]', Output("stdout", "hi\r\n")),
        ('["setup", {}]', Output("setup")),
        ('["disconnect", 1]', Output("disconnect")),
        ('["setup", {"extra": "dropped"}]', Output("setup")),
    ],
)
def test_a_runtime_message_is_read(raw: str, expected: Output) -> None:
    assert messages.parse_output(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'["stdout", "x"]', "text, not binary"),
        ('["stdout", {"html": "<script>"}]', "stdout is"),
        ('["stdout", "a", "b"]', "stdout is"),
        ('["stdin", "x"]', "unknown terminal message"),
        (json.dumps(["stdout", "x" * (messages.MAX_OUTPUT_CHARS + 1)]), "at most"),
        ("[" + " " * messages.MAX_OUTPUT_BYTES + '"setup"]', "at most"),
    ],
)
def test_a_bad_runtime_message_is_dropped_with_the_reason(raw: str | bytes, reason: str) -> None:
    with pytest.raises(TerminalMessageError, match=reason):
        messages.parse_output(raw)


@pytest.mark.parametrize(
    "message",
    [Stdin("ls -l\r"), Stdin('"quoted" \\ é'), Resize(33, 101)],
)
def test_client_messages_go_on_as_they_came(message: Stdin | Resize) -> None:
    assert messages.parse_input(messages.encode_input(message)) == message


@pytest.mark.parametrize(
    "message", [Output("stdout", "\x1b[31mred\x1b[0m\r\n"), Output("setup"), Output("disconnect")]
)
def test_runtime_messages_are_re_encoded_in_the_protocols_shape(message: Output) -> None:
    encoded = messages.encode_output(message)
    assert messages.parse_output(encoded) == message
    assert json.loads(encoded)[0] == message.kind


def test_the_largest_output_piece_fits_the_servers_read_limit() -> None:
    """The runtime splits output into pieces the server will take, escapes and all."""
    worst = Output("stdout", "\x00" * messages.MAX_OUTPUT_CHARS)
    assert len(messages.encode_output(worst)) <= messages.MAX_OUTPUT_BYTES
