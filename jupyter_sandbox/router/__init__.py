"""Reverse proxy for HTTP and WebSocket that routes by X-Sandbox-* headers."""
