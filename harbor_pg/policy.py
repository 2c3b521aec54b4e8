"""MemoryPolicy: the knobs recall, the context builder and the extractor all read.

The policy sits low in the package (beside ``records``) because recall and
extraction read it as much as the per-turn builder does; keeping it out of
``context/`` keeps every import pointing down the data flow.

Every field is validated when the policy is built, so an incoherent policy
fails at wiring time with :class:`~harbor_pg.errors.MemoryConfigurationError`
instead of misbehaving on some later turn.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryScope
from harbor_pg.records import Sensitivity

__all__ = [
    "DEFAULT_RECALL_SCOPES",
    "BudgetAllowance",
    "BudgetSplit",
    "MemoryPolicy",
]

#: Scopes recall consults by default (seed 000), narrowest-first after USER.
DEFAULT_RECALL_SCOPES: tuple[MemoryScope, ...] = (
    MemoryScope.USER,
    MemoryScope.PROJECT,
    MemoryScope.SESSION,
    MemoryScope.TENANT,
)

# Float noise such as 0.29 * 100 == 28.999999999999996 must not cost a token.
_FLOOR_EPSILON = 1e-9
_SUM_TOLERANCE = 1e-6


def _floor_tokens(value: float) -> int:
    return math.floor(value + _FLOOR_EPSILON)


def _config_error(model: str, exc: ValidationError) -> MemoryConfigurationError:
    """One readable line per problem, each naming the offending field."""
    parts = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error.get("loc", ()))
        msg = str(error.get("msg", "")).removeprefix("Value error, ")
        named = not loc or msg.startswith(str(error["loc"][-1]))
        parts.append(msg if named else f"{loc}: {msg}")
    return MemoryConfigurationError(f"invalid {model}: " + "; ".join(parts))


def _check_int(name: str, value: object) -> int:
    # bool is an int subclass and 2.0 would coerce silently; both are wiring mistakes.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    return value


def _check_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    return number


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {type(value).__name__}")
    return value


class BudgetAllowance(NamedTuple):
    """Token allowance per share of a total prompt budget."""

    session: int
    episodic: int
    system: int
    current_turn: int

    @property
    def total(self) -> int:
        """Sum of the four allowances (equals the budget they were cut from)."""
        return self.session + self.episodic + self.system + self.current_turn


class BudgetSplit(BaseModel):
    """How a total prompt token budget is shared out (seed 004).

    ``session`` is for recent turns, ``episodic`` for recalled long-term
    memories, ``system`` for the application's system prompt and
    ``current_turn`` for the question being answered. Each share is filled and
    pruned on its own: an unused share is never handed to another, and
    retrieval never touches the ``system`` share. The four fractions must each
    lie in 0..1 and add up to 1 (within 1e-6).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    session: float = 0.35
    episodic: float = 0.25
    system: float = 0.30
    current_turn: float = 0.10

    @field_validator("session", "episodic", "system", "current_turn", mode="before")
    @classmethod
    def _fraction(cls, value: object, info: Any) -> float:
        number = _check_float(info.field_name, value)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"{info.field_name} must be within 0..1, got {number}")
        return number

    @model_validator(mode="after")
    def _sums_to_one(self) -> BudgetSplit:
        total = self.session + self.episodic + self.system + self.current_turn
        if abs(total - 1.0) > _SUM_TOLERANCE:
            raise ValueError(
                f"session + episodic + system + current_turn must add up to 1, got {total:.6f}"
            )
        return self

    def allocate(self, total_tokens: int) -> BudgetAllowance:
        """Cut ``total_tokens`` into per-share token allowances.

        Each retrieval share is floored; the rounding remainder goes to
        ``system``, the one share retrieval never spends, so the allowances
        always add up to ``total_tokens`` without any share exceeding its
        fraction. Raises ``ValueError`` for a negative or non-integer total.
        """
        if isinstance(total_tokens, bool) or not isinstance(total_tokens, int):
            raise ValueError(f"total_tokens must be an integer, got {type(total_tokens).__name__}")
        if total_tokens < 0:
            raise ValueError(f"total_tokens must be >= 0, got {total_tokens}")
        session = _floor_tokens(self.session * total_tokens)
        episodic = _floor_tokens(self.episodic * total_tokens)
        current_turn = _floor_tokens(self.current_turn * total_tokens)
        system = max(0, total_tokens - session - episodic - current_turn)
        return BudgetAllowance(session, episodic, system, current_turn)

    # Defined last so it wraps every other validator, the after-validators included.
    @model_validator(mode="wrap")
    @classmethod
    def _as_configuration_error(
        cls, data: Any, handler: ModelWrapValidatorHandler[BudgetSplit]
    ) -> BudgetSplit:
        try:
            return handler(data)
        except ValidationError as exc:
            raise _config_error("BudgetSplit", exc) from None


_INT_FIELDS = (
    "recent_max_messages",
    "recent_max_tokens",
    "summary_keep_messages",
    "recall_top_k",
    "summarise_after_turns",
    "max_session_turns",
    "max_content_chars",
    "rrf_k",
    "profile_max_tokens",
)
_FLOAT_FIELDS = (
    "summary_trigger_fraction",
    "recency_half_life_hours",
    "block_budget_fraction",
    "extraction_min_importance",
    "dedup_threshold",
    "entity_confidence_floor",
    "entity_overlap_weight",
    "type_affinity_weight",
    "summary_cooldown_seconds",
)
_BOOL_FIELDS = ("enabled", "query_rewrite")

# (lower, lower inclusive, upper, upper inclusive); None = unbounded.
_RANGES: dict[str, tuple[float | None, bool, float | None, bool]] = {
    "recent_max_messages": (1, True, None, False),
    "recent_max_tokens": (1, True, None, False),
    "summary_trigger_fraction": (0.0, False, 1.0, True),
    "summary_keep_messages": (1, True, None, False),
    "recall_top_k": (0, True, None, False),
    "recency_half_life_hours": (0.0, False, None, False),
    "block_budget_fraction": (0.0, False, 1.0, True),
    "extraction_min_importance": (0.0, True, 1.0, True),
    "dedup_threshold": (0.0, False, 1.0, True),
    "entity_confidence_floor": (0.0, True, 1.0, True),
    "entity_overlap_weight": (0.0, True, 2.0, True),
    "type_affinity_weight": (0.0, True, 2.0, True),
    "summarise_after_turns": (1, True, None, False),
    "summary_cooldown_seconds": (0.0, True, None, False),
    "max_session_turns": (1, True, None, False),
    "max_content_chars": (1, True, None, False),
    "rrf_k": (1, True, None, False),
    "profile_max_tokens": (0, True, None, False),
}


def _check_range(name: str, value: float) -> None:
    low, low_inclusive, high, high_inclusive = _RANGES[name]
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if not (too_low or too_high):
        return
    if high is None:
        bound = f"{'>=' if low_inclusive else '>'} {low:g}"
    else:
        left = "[" if low_inclusive else "("
        right = "]" if high_inclusive else ")"
        bound = f"within {left}{low:g}, {high:g}{right}"
    raise ValueError(f"{name} must be {bound}, got {value:g}")


class MemoryPolicy(BaseModel):
    """Every tunable of harbor-pg's memory behaviour, validated at construction.

    Fields from seed 000:

    - ``enabled``: when false, the builder returns a plain window and calls no model.
    - ``recent_max_messages``: how many messages are loaded from history.
    - ``recent_max_tokens``: token budget for the verbatim window.
    - ``summary_trigger_fraction``: share of that budget, in (0, 1], whose
      crossing triggers a rolling-summary refresh.
    - ``summary_keep_messages``: messages kept verbatim after a refresh (at most
      ``recent_max_messages``; the boundary may keep more to respect user turns).
    - ``recall_top_k``: how many long-term memories recall may return (0 disables recall).
    - ``recall_scopes``: scopes recall consults; non-empty unless recall is off,
      without duplicates. Strings such as ``"user"`` are accepted.
    - ``recency_half_life_hours``: recall recency decay half-life (> 0); 4320
      (180 days) by default, for conversations that span months (chosen by
      cross-validation on LoCoMo, benchmarks/RESULTS.md).
    - ``block_budget_fraction``: share, in (0, 1], of ``recent_max_tokens`` the
      recalled memory block may take (see :attr:`block_budget_tokens`).
    - ``query_rewrite``: condense the question into a standalone query.
    - ``extraction_min_importance``: importance floor (0..1) a proposed fact must clear.
    - ``dedup_threshold``: index similarity, in (0, 1], at or above which a
      proposed fact is a restatement.
    - ``entity_confidence_floor``: confidence (0..1) a resolved entity mention must clear.
    - ``entity_overlap_weight``: recall boost for entity overlap, 0..2 (0 disables).
    - ``type_affinity_weight``: recall boost for a wanted memory type, 0..2 (0 disables).

    Fields from seed 004 and the design:

    - ``summarise_after_turns``: turns after which a session summary is written (>= 1).
    - ``summary_cooldown_seconds``: per-session pause between summary refreshes (>= 0).
    - ``max_session_turns``: cap on messages one short-term read returns; must
      be at least ``recent_max_messages``.
    - ``max_content_chars``: longest message or memory content accepted (>= 1).
    - ``rrf_k``: reciprocal-rank-fusion constant, ``1 / (rrf_k + rank)`` (>= 1);
      5 by default (cross-validated on LoCoMo: a small constant spreads relevance
      enough that the recency factor reorders only near-ties).
    - ``relevance_threshold``: minimum relevance, 0..1, a recalled memory must
      reach; ``None`` uses the threshold the embedder was calibrated for.
    - ``budget``: optional :class:`BudgetSplit` for callers that pass one total
      prompt budget; ``None`` means only the seed-000 budgets apply.
    - ``recall_max_sensitivity``: the most sensitive memories recall (and so the
      snapshot and the context builder) may put in front of a model; memories
      classified above it are left out while candidates are generated, so they
      never take a place in the result. Default ``pii``: ``sensitive`` memories
      need an explicit opt-in (``recall_max_sensitivity="sensitive"``).
    - ``recall_fusion``: how recall fuses its dense and lexical lists, ``"rrf"``
      (reciprocal rank fusion, the default) or ``"weighted"`` (a blend of each
      leg's scores, min-max normalised over its candidates); see ``harbor.recall()``.
    - ``profile_max_tokens``: tokens of the user's profile (``MemoryManager.profile``)
      the context builder puts in :attr:`MemoryContext.profile`, beside the recalled
      memories, which then leave out what the profile holds; 0 (the default) builds
      no profile.
    - ``importance_half_life_hours``: importance decay in recall. ``None`` (the
      default): none, and recall writes nothing. A number of hours (> 0): recall
      counts its hits after it returns (``harbor.memory_hits``), and a memory's
      importance in the ranking is its importance times 0.5 ^ (hours since recall
      last returned it, or since it became valid, / this half-life): never more
      than its importance.

    Any violation raises :class:`MemoryConfigurationError` naming the field.
    The model is frozen; derive variants with :meth:`with_changes`, which
    validates again (pydantic's ``model_copy(update=...)`` would not).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    recent_max_messages: int = 12
    recent_max_tokens: int = 2000
    summary_trigger_fraction: float = 0.7
    summary_keep_messages: int = 8
    recall_top_k: int = 6
    recall_scopes: tuple[MemoryScope, ...] = DEFAULT_RECALL_SCOPES
    # recency_half_life_hours, entity/type weights, rrf_k, fusion and max sensitivity stand
    # again as RecallRequest's defaults (context/recall.py), on purpose; a unit test pins them.
    recency_half_life_hours: float = 4320.0
    block_budget_fraction: float = 0.15
    query_rewrite: bool = True
    extraction_min_importance: float = 0.3
    dedup_threshold: float = 0.92
    entity_confidence_floor: float = 0.5
    entity_overlap_weight: float = 0.5
    type_affinity_weight: float = 0.5
    summarise_after_turns: int = 20
    summary_cooldown_seconds: float = 300.0
    max_session_turns: int = 50
    max_content_chars: int = 20_000
    rrf_k: int = 5
    relevance_threshold: float | None = None
    budget: BudgetSplit | None = None
    recall_max_sensitivity: Sensitivity = Sensitivity.PII
    recall_fusion: Literal["rrf", "weighted"] = "rrf"
    profile_max_tokens: int = 0
    importance_half_life_hours: float | None = None

    # The validators below share one shape on purpose: pydantic's one validator per field group.
    @field_validator(*_INT_FIELDS, mode="before")
    @classmethod
    def _int_field(cls, value: object, info: Any) -> int:
        number = _check_int(info.field_name, value)
        _check_range(info.field_name, number)
        return number

    @field_validator(*_FLOAT_FIELDS, mode="before")
    @classmethod
    def _float_field(cls, value: object, info: Any) -> float:
        number = _check_float(info.field_name, value)
        _check_range(info.field_name, number)
        return number

    @field_validator(*_BOOL_FIELDS, mode="before")
    @classmethod
    def _bool_field(cls, value: object, info: Any) -> bool:
        return _check_bool(info.field_name, value)

    @field_validator("relevance_threshold", mode="before")
    @classmethod
    def _threshold(cls, value: object) -> float | None:
        if value is None:
            return None
        number = _check_float("relevance_threshold", value)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"relevance_threshold must be None or within 0..1, got {number}")
        return number

    @field_validator("importance_half_life_hours", mode="before")
    @classmethod
    def _importance_half_life(cls, value: object) -> float | None:
        if value is None:
            return None
        number = _check_float("importance_half_life_hours", value)
        if not (number > 0 and math.isfinite(number)):
            raise ValueError(
                f"importance_half_life_hours must be None or a finite number > 0, got {number}"
            )
        return number

    @field_validator("recall_scopes", mode="before")
    @classmethod
    def _scopes(cls, value: object) -> tuple[MemoryScope, ...]:
        # A bare string is iterable too; "user" must not become five bogus scopes.
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise ValueError(
                f"recall_scopes must be a list or tuple of scopes, got {type(value).__name__}"
            )
        scopes: list[MemoryScope] = []
        for item in value:
            if isinstance(item, MemoryScope):
                scope = item
            elif isinstance(item, str):
                try:
                    scope = MemoryScope(item.strip().lower())
                except ValueError:
                    raise ValueError(
                        f"recall_scopes has unknown scope {item!r}; "
                        f"use one of {[s.value for s in MemoryScope]}"
                    ) from None
            else:
                raise ValueError(
                    f"recall_scopes items must be MemoryScope or str, got {type(item).__name__}"
                )
            if scope in scopes:
                raise ValueError(f"recall_scopes lists {scope.value!r} twice")
            scopes.append(scope)
        return tuple(scopes)

    @model_validator(mode="after")
    def _coherent(self) -> MemoryPolicy:
        if self.summary_keep_messages > self.recent_max_messages:
            raise ValueError(
                f"summary_keep_messages ({self.summary_keep_messages}) must not exceed "
                f"recent_max_messages ({self.recent_max_messages})"
            )
        if self.recent_max_messages > self.max_session_turns:
            raise ValueError(
                f"recent_max_messages ({self.recent_max_messages}) must not exceed "
                f"max_session_turns ({self.max_session_turns})"
            )
        if self.recall_top_k > 0 and not self.recall_scopes:
            raise ValueError("recall_scopes must not be empty while recall_top_k > 0")
        return self

    @classmethod
    def disabled(cls) -> MemoryPolicy:
        """The escape hatch: no model calls, no repository writes, a four-message window."""
        return cls(
            enabled=False,
            recent_max_messages=4,
            summary_keep_messages=4,
            query_rewrite=False,
            recall_top_k=0,
        )

    def with_changes(self, **changes: Any) -> MemoryPolicy:
        """Return a copy with ``changes`` applied, validated like a new policy."""
        data = self.model_dump()
        data["budget"] = self.budget
        data.update(changes)
        return type(self)(**data)

    @property
    def block_budget_tokens(self) -> int:
        """Token budget of the recalled-memory block (``block_budget_fraction`` of the window)."""
        return _floor_tokens(self.block_budget_fraction * self.recent_max_tokens)

    @property
    def summary_trigger_tokens(self) -> int:
        """Window size in tokens above which the rolling summary is refreshed."""
        return _floor_tokens(self.summary_trigger_fraction * self.recent_max_tokens)

    def allocate_budget(self, total_tokens: int) -> BudgetAllowance | None:
        """Split ``total_tokens`` by :attr:`budget`, or ``None`` when no split is configured."""
        return None if self.budget is None else self.budget.allocate(total_tokens)

    # Defined last so it wraps every other validator, the after-validators included.
    @model_validator(mode="wrap")
    @classmethod
    def _as_configuration_error(
        cls, data: Any, handler: ModelWrapValidatorHandler[MemoryPolicy]
    ) -> MemoryPolicy:
        try:
            return handler(data)
        except ValidationError as exc:
            raise _config_error("MemoryPolicy", exc) from None
