"""JupyterLab's visual debugger on a sandboxed kernel, message for message.

What JupyterLab's debugger sends (the Debug Adapter Protocol inside
``debug_request`` on the control channel, events back as ``debug_event`` on
IOPub), the way ipykernel's own debugger tests drive it: the sandboxed kernel
stops at a breakpoint, shows the frame's variables and runs on, exactly as a
plain ipykernel does.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

pytestmark = pytest.mark.usefixtures("warm_daemon")

CELL = "def add(a, b):\n    total = a + b\n    return total\n\nresult = add(2, 3)\n"
TIMEOUT = 60


class Debugger:
    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.seq = itertools.count(1)

    async def request(self, command: str, arguments: dict[str, Any] | None = None) -> dict:
        content = {
            "type": "request",
            "seq": next(self.seq),
            "command": command,
            "arguments": arguments or {},
        }
        msg = self.kc.session.msg("debug_request", content)
        self.kc.control_channel.send(msg)
        while True:
            reply = await self.kc.get_control_msg(timeout=TIMEOUT)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply["content"])

    async def event(self, name: str) -> dict:
        while True:
            msg = await self.kc.get_iopub_msg(timeout=TIMEOUT)
            if msg["msg_type"] == "debug_event" and msg["content"].get("event") == name:
                return dict(msg["content"])


@pytest.mark.parametrize("kernel_name", ["python3", "sandbox-default"])
async def test_the_debugger_stops_at_a_breakpoint(kernel_name: str) -> None:
    km = AsyncKernelManager(kernel_name=kernel_name)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        info = await kc.kernel_info(reply=True, timeout=TIMEOUT)
        # JupyterLab offers the debugger only when the kernel says it has one
        content = info["content"]
        assert content.get("debugger") or "debugger" in content.get("supported_features", [])
        debugger = Debugger(kc)
        reply = await debugger.request(
            "initialize",
            {
                "clientID": "jupyterlab",
                "adapterID": "",
                "pathFormat": "path",
                "linesStartAt1": True,
                "columnsStartAt1": True,
                "supportsVariableType": True,
                "supportsVariablePaging": True,
                "supportsRunInTerminalRequest": True,
                "locale": "en",
            },
        )
        assert reply["success"], reply
        assert (await debugger.request("attach"))["success"]
        source = (await debugger.request("dumpCell", {"code": CELL}))["body"]["sourcePath"]
        reply = await debugger.request(
            "setBreakpoints",
            {"breakpoints": [{"line": 2}], "source": {"path": source}, "sourceModified": False},
        )
        assert reply["body"]["breakpoints"][0]["verified"], reply
        assert (await debugger.request("configurationDone"))["success"]

        kc.execute(CELL)
        stopped = await debugger.event("stopped")
        thread = stopped["body"]["threadId"]
        frames = (await debugger.request("stackTrace", {"threadId": thread}))["body"]
        frame = frames["stackFrames"][0]
        assert (frame["name"], frame["line"], frame["source"]["path"]) == ("add", 2, source)
        scopes = (await debugger.request("scopes", {"frameId": frame["id"]}))["body"]["scopes"]
        variables = await debugger.request(
            "variables", {"variablesReference": scopes[0]["variablesReference"]}
        )
        values = {v["name"]: v["value"] for v in variables["body"]["variables"]}
        assert (values["a"], values["b"]) == ("2", "3"), values
        assert (await debugger.request("continue", {"threadId": thread}))["success"]
        reply = await kc.execute_interactive("print(result)", timeout=TIMEOUT)
        assert reply["content"]["status"] == "ok"
        await debugger.request("disconnect", {"restart": False, "terminateDebuggee": True})
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
