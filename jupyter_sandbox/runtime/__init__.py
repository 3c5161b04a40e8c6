"""The runtime server that runs inside every sandbox.

It hosts one ipykernel, started when the sandbox boots so a claim gets a ready
kernel, relays the kernel channels over one WebSocket, and serves the command and
file API of the upstream agent-sandbox python runtime.
"""
