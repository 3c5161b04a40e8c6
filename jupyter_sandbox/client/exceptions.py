"""Errors of the SDK, with upstream's class names.

Control-plane errors (``jupyter_sandbox.control_plane.base.ClaimError``) are
translated into these; the original is kept as ``__cause__`` and its stable
``reason`` word and ``hint`` are copied over.
"""

from __future__ import annotations

from typing import Any

from ..control_plane import base


class SandboxError(RuntimeError):
    """Base class for all sandbox-related errors."""

    reason: str = ""
    hint: str = ""

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} ({self.hint})" if self.hint else text


class SandboxNotReadyError(SandboxError):
    """The sandbox did not become ready (in time)."""


class SandboxTimeoutError(SandboxNotReadyError, TimeoutError):
    """Waiting for the claim to become ready took longer than allowed."""


class SandboxNotFoundError(SandboxError):
    """The sandbox or its claim does not exist (any more)."""


class SandboxTemplateNotFoundError(SandboxError):
    """The sandbox template does not exist."""


class SandboxWarmPoolNotFoundError(SandboxError):
    """The warm pool named in ``create_sandbox(warmpool=...)`` does not exist."""


class SandboxClaimFailedError(SandboxError):
    """The claim failed and will not become ready without user action."""


class SandboxQuotaExceededError(SandboxClaimFailedError):
    """Too many claims."""


class SandboxInvalidRequestError(SandboxError, ValueError):
    """The request was malformed (bad label, name, option ...)."""


class SandboxPathError(SandboxInvalidRequestError):
    """A file path that leaves the workspace or cannot name a file."""


class SandboxKernelBusyError(SandboxError):
    """``suspend()`` refused: the kernel is running a cell (pass ``force=True`` to lose it)."""


class SandboxBackendUnavailableError(SandboxError):
    """The control plane (local daemon, Kubernetes API) could not be reached."""


class SandboxPortForwardError(SandboxError):
    """``kubectl port-forward`` to the router failed."""


class SandboxRequestError(SandboxError):
    """An HTTP request to the sandbox runtime (through the router) failed.

    ``status_code`` is the HTTP status, or None when no response came at all.
    """

    def __init__(self, message: str, status_code: int | None = None, response: Any = None):
        super().__init__(message)
        self.status_code = status_code
        self.response = response


_BY_REASON: dict[str, type[SandboxError]] = {
    base.PoolNotFound.reason: SandboxWarmPoolNotFoundError,
    base.ClaimNotFound.reason: SandboxNotFoundError,
    base.ClaimTimeout.reason: SandboxTimeoutError,
    base.QuotaExceeded.reason: SandboxQuotaExceededError,
    base.InvalidRequest.reason: SandboxInvalidRequestError,
    base.BackendUnavailable.reason: SandboxBackendUnavailableError,
    base.KernelBusy.reason: SandboxKernelBusyError,
}


def from_claim_error(exc: base.ClaimError) -> SandboxError:
    """The SDK error for a control-plane error (raise it ``from exc``)."""
    cls = _BY_REASON.get(exc.reason, SandboxClaimFailedError)
    err = cls(exc.message)
    err.reason = exc.reason
    err.hint = exc.hint
    return err
