"""Speed of sandboxed kernels, each figure measured beside its baseline in the same run."""
