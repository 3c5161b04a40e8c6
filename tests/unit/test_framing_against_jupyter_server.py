"""Our v1 kernel WebSocket framing (jupyter_sandbox/protocol/framing.py) against
jupyter_server's own serializer, on generated messages: the bytes we send are
the bytes JupyterLab's server would send, and each side reads the other's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)

from jupyter_sandbox.protocol import framing

channels = st.sampled_from(["shell", "iopub", "stdin", "control", "hb"]) | st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
)
# header, parent header, metadata, content, then any binary buffers
messages = st.lists(st.binary(max_size=256), min_size=4, max_size=9)


@settings(max_examples=300, deadline=None)
@given(channel=channels, parts=messages)
def test_we_write_what_jupyter_server_writes(channel: str, parts: list[bytes]) -> None:
    assert framing.encode(channel, parts) == serialize_msg_to_ws_v1(parts, channel)


@settings(max_examples=300, deadline=None)
@given(channel=channels, parts=messages)
def test_each_reads_the_other(channel: str, parts: list[bytes]) -> None:
    assert framing.decode(serialize_msg_to_ws_v1(parts, channel)) == (channel, parts)
    ours = framing.encode(channel, parts)
    their_channel, their_parts = deserialize_msg_from_ws_v1(ours)
    assert (their_channel, [bytes(p) for p in their_parts]) == (channel, parts)
    view_channel, views = framing.decode_views(ours)
    assert (view_channel, [bytes(v) for v in views]) == (channel, parts)
