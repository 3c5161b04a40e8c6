"""The kernel provisioner, its ZMQ<->WebSocket bridge and the culling-aware kernel manager."""
