"""The runtime's message hub: what each kind of client is sent, live and replayed."""

from __future__ import annotations

import json

import pytest

from jupyter_sandbox.protocol import framing
from jupyter_sandbox.runtime.hub import ChannelHub


class Client:
    def __init__(self, signed: bool) -> None:
        self.signed = signed
        self.frames: list[tuple[str, list[bytes]]] = []

    def send_frame(self, frame: framing.Pieces) -> None:
        self.frames.append(framing.decode(b"".join(bytes(piece) for piece in frame.pieces)))


def message(msg_id: str, parent: str | None = None) -> list[bytes]:
    head = json.dumps({"msg_id": msg_id, "msg_type": "stream"}).encode()
    parent_head = json.dumps({"msg_id": parent}).encode() if parent else b"{}"
    return [head, parent_head, b"{}", b'{"text": "x"}', b"buffer"]


@pytest.mark.parametrize(
    ("signed", "expected"),
    [(False, message("m1")), (True, [b"sig-m1", *message("m1")])],
    ids=["v1: the parts alone", "signed: the signature first"],
)
def test_a_live_message_is_framed_for_each_client(signed: bool, expected: list[bytes]) -> None:
    hub = ChannelHub()
    client = Client(signed)
    hub.attach(client, None)
    hub.publish("iopub", message("m1"), b"sig-m1")
    assert client.frames == [("iopub", expected)]


@pytest.mark.parametrize("signed", [False, True], ids=["v1", "signed"])
def test_what_nobody_received_is_replayed_in_the_new_clients_framing(signed: bool) -> None:
    hub = ChannelHub()
    hub.publish("iopub", message("m1"), b"sig-m1")
    hub.publish("iopub", message("m2"), b"sig-m2")
    client = Client(signed)
    hub.attach(client, None)
    expected = [message("m1"), message("m2")]
    if signed:
        expected = [[b"sig-m1", *expected[0]], [b"sig-m2", *expected[1]]]
    assert client.frames == [("iopub", parts) for parts in expected]


def test_a_reply_goes_to_its_requester_in_its_framing_and_a_resume_replays_after_last() -> None:
    hub = ChannelHub()
    browser, bridge = Client(signed=False), Client(signed=True)
    hub.attach(browser, None)
    hub.attach(bridge, None)
    hub.record_request(bridge, message("request"))
    hub.publish("shell", message("reply", parent="request"), b"sig-reply")
    hub.publish("iopub", message("out", parent="request"), b"sig-out")
    assert [channel for channel, _ in browser.frames] == ["iopub"]
    assert bridge.frames[0] == ("shell", [b"sig-reply", *message("reply", parent="request")])
    again = Client(signed=True)
    hub.attach(again, "reply")  # reconnected after the reply: only what came later
    assert again.frames == [("iopub", [b"sig-out", *message("out", parent="request")])]


def test_the_ring_counts_the_parts_whatever_the_framing() -> None:
    hub = ChannelHub(ring_bytes=100, ring_messages=10)
    parts = message("m1")
    hub.publish("iopub", parts, b"x" * 64)
    assert hub._ring_bytes == sum(len(part) for part in parts)
    for number in range(2, 10):
        hub.publish("iopub", message(f"m{number}"), b"x" * 64)
    assert hub._ring_bytes <= 100
