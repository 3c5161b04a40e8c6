"""Control planes: claim, wait ready, suspend, resume, release, status and list sandboxes."""

from .base import (
    ClaimError,
    ClaimNotFound,
    ClaimRequest,
    ClaimStatus,
    ControlPlane,
    Endpoint,
    Phase,
    PoolNotFound,
    PoolStatus,
)

__all__ = [
    "ClaimError",
    "ClaimNotFound",
    "ClaimRequest",
    "ClaimStatus",
    "ControlPlane",
    "Endpoint",
    "Phase",
    "PoolNotFound",
    "PoolStatus",
]
