"""Per-user limits of the claim service: sandboxes held, and cold starts per minute.

Pure bookkeeping (no I/O), so the rules are table-tested on their own; the
service asks ``check_claim`` under a per-user lock before it creates a claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..control_plane.base import QuotaExceeded


@dataclass
class Limits:
    """0 lifts a limit."""

    max_claims_per_user: int = 10
    cold_starts_per_minute: float = 10.0

    def __post_init__(self) -> None:
        if self.max_claims_per_user < 0 or self.cold_starts_per_minute < 0:
            raise ValueError("limits are 0 (none) or more")


@dataclass
class ColdStartBudget:
    """A token bucket per user: ``per_minute`` cold starts, refilled evenly, at most
    ``per_minute`` at once (a user who waited a minute may start that many)."""

    per_minute: float
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # user -> (tokens, at)

    def available(self, user: str, now: float) -> float:
        tokens, at = self._buckets.get(user, (self.per_minute, now))
        return min(self.per_minute, tokens + (now - at) * self.per_minute / 60.0)

    def take(self, user: str, now: float) -> bool:
        """Spend one cold start of ``user``'s; False (nothing spent) when none is left."""
        tokens = self.available(user, now)
        if tokens < 1.0:
            return False
        self._buckets[user] = (tokens - 1.0, now)
        return True

    def wait_seconds(self, user: str, now: float) -> float:
        """How long until ``user`` may cold-start again."""
        missing = 1.0 - self.available(user, now)
        return max(0.0, missing * 60.0 / self.per_minute) if self.per_minute else 0.0


class UserLimits:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.cold = ColdStartBudget(limits.cold_starts_per_minute)

    def check_claim(self, user: str, held: int, cold: bool, now: float) -> None:
        """Refuse (QuotaExceeded, 429) a new claim of ``user``'s, who holds ``held``
        claims; ``cold``: no warm sandbox is ready, so it starts a new pod."""
        limit = self.limits.max_claims_per_user
        if limit and held >= limit:
            raise QuotaExceeded(
                f"{user} already has {held} sandboxed kernels (at most {limit} per user)",
                hint="shut down a kernel you no longer need (Kernel > Shut Down Kernel, "
                "or the Running panel), then start this one again",
            )
        if cold and self.limits.cold_starts_per_minute and not self.cold.take(user, now):
            wait = self.cold.wait_seconds(user, now)
            raise QuotaExceeded(
                f"{user} started {self.limits.cold_starts_per_minute:g} new sandboxes in the "
                "last minute, the most allowed while the warm pool is empty",
                hint=f"try again in {max(1, round(wait))} s",
            )
