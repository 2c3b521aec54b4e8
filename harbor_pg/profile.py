"""A user's profile: their current durable memories in two sections, within a budget.

PostgreSQL answers with ``harbor.profile()`` (``sql/functions/profile.sql``); the
rules below are the same for stores that are not PostgreSQL (the in-process
store, or one of your own), and the reference the SQL is tested against:

- the memories valid at ``as_of`` of the requested scopes, never rolling
  summaries, at most ``max_sensitivity``, one per content hash (the more
  important copy, then the older, then the narrower scope);
- ``stable``: valid for at least ``stable_after`` at ``as_of``, most important
  first, then the most often recalled (``hits``), then the longest held;
  ``recent``: the rest, newest first, then the most important;
- ``token_budget`` split in two halves (the stable section takes the odd
  token); a section that needs less than its half leaves the rest to the other;
  each section is cut at the first memory that would pass its share, so it is a
  prefix of its order. A line costs the tokens of ``[<hash12>] <content>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from harbor_pg.errors import MemoryValidationError
from harbor_pg.owner import MemoryScope
from harbor_pg.ranking import render_recalled
from harbor_pg.records import Memory, MemoryType, Sensitivity, normalize_content
from harbor_pg.tokens import TokenCounter, approximate_tokens

__all__ = ["ProfileEntry", "ProfileRequest", "UserProfile", "profile_of"]

#: scopes a profile may read: the caller's own
_PROFILE_SCOPES = frozenset(
    {MemoryScope.USER, MemoryScope.PROJECT, MemoryScope.SESSION, MemoryScope.RUN}
)


@dataclass(frozen=True)
class ProfileRequest:
    """What one profile asks for besides the owner.

    ``scopes``: among USER (the default), PROJECT, SESSION and RUN.
    ``token_budget``: tokens the two sections may fill together (None: no budget).
    ``stable_after``: how long a memory must have been valid to count as stable.
    ``as_of``: the moment the profile describes (None: now).
    ``max_sensitivity``: the most sensitive memories it may hold.
    """

    scopes: tuple[MemoryScope, ...] = (MemoryScope.USER,)
    token_budget: int | None = 400
    stable_after: timedelta = timedelta(days=30)
    as_of: datetime | None = None
    max_sensitivity: Sensitivity = Sensitivity.PII

    def __post_init__(self) -> None:
        scopes = tuple(MemoryScope(s) for s in self.scopes)
        if not scopes:
            raise MemoryValidationError("a profile needs at least one scope")
        if wrong := [s.value for s in scopes if s not in _PROFILE_SCOPES]:
            raise MemoryValidationError(
                f"a profile reads the caller's own scopes (user, project, session, run), "
                f"not {', '.join(wrong)}"
            )
        object.__setattr__(self, "scopes", scopes)
        if self.token_budget is not None and (
            isinstance(self.token_budget, bool)
            or not isinstance(self.token_budget, int)
            or self.token_budget < 0
        ):
            raise MemoryValidationError(
                f"token_budget must be an integer >= 0 or None, got {self.token_budget!r}"
            )
        if not isinstance(self.stable_after, timedelta) or self.stable_after < timedelta(0):
            raise MemoryValidationError(
                f"stable_after must be a timedelta >= 0, got {self.stable_after!r}"
            )
        if self.as_of is not None and self.as_of.tzinfo is None:
            raise MemoryValidationError("as_of must be timezone-aware")
        object.__setattr__(self, "max_sensitivity", Sensitivity(self.max_sensitivity))


@dataclass(frozen=True)
class ProfileEntry:
    """One memory of a profile: its place in its section and its line's tokens."""

    memory: Memory
    rank: int
    tokens: int


@dataclass(frozen=True)
class UserProfile:
    """A user's current durable memories: what has held long (``stable``) and what is new
    (``recent``), each in its order, within the request's token budget."""

    stable: tuple[ProfileEntry, ...] = field(default_factory=tuple)
    recent: tuple[ProfileEntry, ...] = field(default_factory=tuple)

    @property
    def tokens(self) -> int:
        """Tokens of every line of both sections."""
        return sum(e.tokens for e in (*self.stable, *self.recent))

    @property
    def memories(self) -> list[Memory]:
        """Every memory of the profile, the stable section first."""
        return [e.memory for e in (*self.stable, *self.recent)]

    def render(self) -> str:
        """The profile as a prompt block: a heading per non-empty section, one line a memory."""
        parts: list[str] = []
        for title, entries in (("Stable", self.stable), ("Recent", self.recent)):
            if entries:
                parts.append(f"{title}:")
                parts.extend(render_recalled(e.memory) for e in entries)
        return "\n".join(parts)


def _copy_order(memory: Memory) -> tuple[float, datetime, int, str]:
    start = memory.valid_from or datetime.min.replace(tzinfo=UTC)
    return (-memory.importance, start, -memory.scope.narrowness, memory.id or "")


def _stable_order(memory: Memory, hits: int = 0) -> tuple[float, int, datetime, str]:
    start = memory.valid_from or datetime.min.replace(tzinfo=UTC)
    return (-memory.importance, -hits, start, memory.id or "")


def _recent_order(memory: Memory) -> tuple[float, float, str]:
    start = memory.valid_from.timestamp() if memory.valid_from else -math.inf
    return (-start, -memory.importance, memory.id or "")


def _cut(memories: Sequence[Memory], share: int | None, costs: dict[int, int]) -> int:
    """How many of ``memories`` (a prefix) fit in ``share`` tokens (None: all)."""
    used = 0
    n = 0
    for memory in memories:
        used += costs[id(memory)]
        if share is not None and used > share:
            break
        n += 1
    return n


def profile_of(
    memories: Iterable[Memory],
    request: ProfileRequest,
    *,
    as_of: datetime | None = None,
    counter: TokenCounter = approximate_tokens,
    hits: Callable[[str], int] | None = None,
) -> UserProfile:
    """The profile ``request`` asks for, built from ``memories`` (the owner's rows of the
    requested scopes, of any validity) by the rules of ``harbor.profile()``; ``hits``
    says how often recall returned a memory (by id), the stable section's second key."""
    when = as_of or request.as_of or datetime.now(UTC)
    wanted = set(request.scopes)
    current = [
        m
        for m in memories
        if m.scope in wanted
        and m.memory_type is not MemoryType.SUMMARY
        and m.sensitivity.level <= request.max_sensitivity.level
        and m.is_valid_at(when)
    ]
    seen: set[str] = set()
    distinct: list[Memory] = []
    for memory in sorted(current, key=_copy_order):
        key = memory.content_hash or normalize_content(memory.content)
        if key not in seen:
            seen.add(key)
            distinct.append(memory)
    horizon = when - request.stable_after
    count = hits or (lambda _memory_id: 0)
    stable = sorted(
        (m for m in distinct if m.valid_from is None or m.valid_from <= horizon),
        key=lambda m: _stable_order(m, count(m.id or "")),
    )
    recent = sorted(
        (m for m in distinct if m.valid_from is not None and m.valid_from > horizon),
        key=_recent_order,
    )
    costs = {id(m): counter(render_recalled(m)) for m in distinct}
    budget = request.token_budget
    if budget is None:
        stable_share: int | None = None
        recent_share: int | None = None
    else:
        recent_half = budget // 2
        stable_half = budget - recent_half
        stable_need = sum(costs[id(m)] for m in stable)
        recent_need = sum(costs[id(m)] for m in recent)
        stable_share = stable_half + max(recent_half - recent_need, 0)
        recent_share = recent_half + max(stable_half - stable_need, 0)
    n_stable = _cut(stable, stable_share, costs)
    n_recent = _cut(recent, recent_share, costs)
    return UserProfile(
        stable=tuple(
            ProfileEntry(memory=m, rank=i, tokens=costs[id(m)])
            for i, m in enumerate(stable[:n_stable], start=1)
        ),
        recent=tuple(
            ProfileEntry(memory=m, rank=i, tokens=costs[id(m)])
            for i, m in enumerate(recent[:n_recent], start=1)
        ),
    )
