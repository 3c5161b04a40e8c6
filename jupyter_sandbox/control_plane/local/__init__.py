"""The embedded local control plane: a per-user daemon with warm pools of sandbox processes."""
