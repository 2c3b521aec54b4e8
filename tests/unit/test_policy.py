"""MemoryPolicy and BudgetSplit: defaults, validation, budget arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryScope
from harbor_pg.policy import DEFAULT_RECALL_SCOPES, BudgetAllowance, BudgetSplit, MemoryPolicy


def test_defaults_match_the_seed() -> None:
    policy = MemoryPolicy()
    assert policy.enabled is True
    assert policy.recent_max_messages == 12
    assert policy.recent_max_tokens == 2000
    assert policy.summary_trigger_fraction == 0.7
    assert policy.summary_keep_messages == 8
    assert policy.recall_top_k == 6
    assert policy.recall_scopes == (
        MemoryScope.USER,
        MemoryScope.PROJECT,
        MemoryScope.SESSION,
        MemoryScope.TENANT,
    )
    assert policy.recall_scopes == DEFAULT_RECALL_SCOPES
    assert policy.recency_half_life_hours == 4320.0  # 180 days, cross-validated on LoCoMo
    assert policy.block_budget_fraction == 0.15
    assert policy.query_rewrite is True
    assert policy.extraction_min_importance == 0.3
    assert policy.dedup_threshold == 0.92
    assert policy.entity_confidence_floor == 0.5
    assert policy.entity_overlap_weight == 0.5
    assert policy.type_affinity_weight == 0.5
    assert policy.summarise_after_turns == 20
    assert policy.summary_cooldown_seconds == 300.0
    assert policy.max_session_turns == 50
    assert policy.max_content_chars == 20_000
    assert policy.rrf_k == 5  # cross-validated on LoCoMo
    assert policy.relevance_threshold is None
    assert policy.budget is None
    assert not hasattr(policy, "relevance_weights")


def test_derived_budgets() -> None:
    policy = MemoryPolicy()
    assert policy.block_budget_tokens == 300
    assert policy.summary_trigger_tokens == 1400
    # 0.29 * 100 is 28.999999999999996 in binary floating point
    assert MemoryPolicy(block_budget_fraction=0.29, recent_max_tokens=100).block_budget_tokens == 29
    assert MemoryPolicy(block_budget_fraction=0.15, recent_max_tokens=7).block_budget_tokens == 1


def test_policy_is_frozen() -> None:
    policy = MemoryPolicy()
    with pytest.raises(ValidationError):
        policy.recall_top_k = 3


def test_disabled() -> None:
    policy = MemoryPolicy.disabled()
    assert policy.enabled is False
    assert policy.recent_max_messages == 4
    assert policy.summary_keep_messages <= 4
    assert policy.query_rewrite is False
    assert policy.recall_top_k == 0


def test_scopes_accept_strings_and_global() -> None:
    scopes: Any = ["session", "USER", MemoryScope.GLOBAL, " run "]
    policy = MemoryPolicy(recall_scopes=scopes)
    assert policy.recall_scopes == (
        MemoryScope.SESSION,
        MemoryScope.USER,
        MemoryScope.GLOBAL,
        MemoryScope.RUN,
    )


def test_empty_scopes_allowed_when_recall_is_off() -> None:
    assert MemoryPolicy(recall_top_k=0, recall_scopes=()).recall_scopes == ()


def test_boundary_values_accepted() -> None:
    policy = MemoryPolicy(
        summary_trigger_fraction=1.0,
        block_budget_fraction=1.0,
        summary_keep_messages=12,
        extraction_min_importance=0.0,
        dedup_threshold=1.0,
        entity_confidence_floor=1.0,
        entity_overlap_weight=2.0,
        type_affinity_weight=0,
        summary_cooldown_seconds=0,
        relevance_threshold=0.0,
        recent_max_messages=50,
        rrf_k=1,
    )
    assert policy.type_affinity_weight == 0.0
    assert isinstance(policy.type_affinity_weight, float)
    assert isinstance(policy.summary_cooldown_seconds, float)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"enabled": "yes"}, "enabled"),
        ({"enabled": 1}, "enabled"),
        ({"query_rewrite": None}, "query_rewrite"),
        ({"recent_max_messages": 0}, "recent_max_messages"),
        ({"recent_max_messages": True}, "recent_max_messages"),
        ({"recent_max_messages": 12.0}, "recent_max_messages"),
        ({"recent_max_messages": "12"}, "recent_max_messages"),
        ({"recent_max_tokens": 0}, "recent_max_tokens"),
        ({"recent_max_tokens": -5}, "recent_max_tokens"),
        ({"summary_trigger_fraction": 0.0}, "summary_trigger_fraction"),
        ({"summary_trigger_fraction": 1.01}, "summary_trigger_fraction"),
        ({"summary_trigger_fraction": "0.7"}, "summary_trigger_fraction"),
        ({"summary_keep_messages": 0}, "summary_keep_messages"),
        ({"summary_keep_messages": 13}, "summary_keep_messages"),
        ({"recall_top_k": -1}, "recall_top_k"),
        ({"recall_scopes": []}, "recall_scopes"),
        ({"recall_scopes": "user"}, "recall_scopes"),
        ({"recall_scopes": ["user", "user"]}, "recall_scopes"),
        ({"recall_scopes": [MemoryScope.USER, "user"]}, "recall_scopes"),
        ({"recall_scopes": ["planet"]}, "recall_scopes"),
        ({"recall_scopes": [3]}, "recall_scopes"),
        ({"recall_scopes": None}, "recall_scopes"),
        ({"recency_half_life_hours": 0}, "recency_half_life_hours"),
        ({"recency_half_life_hours": float("inf")}, "recency_half_life_hours"),
        ({"recency_half_life_hours": float("nan")}, "recency_half_life_hours"),
        ({"block_budget_fraction": 0}, "block_budget_fraction"),
        ({"block_budget_fraction": 1.5}, "block_budget_fraction"),
        ({"extraction_min_importance": -0.1}, "extraction_min_importance"),
        ({"extraction_min_importance": 1.1}, "extraction_min_importance"),
        ({"dedup_threshold": 0}, "dedup_threshold"),
        ({"dedup_threshold": 1.2}, "dedup_threshold"),
        ({"entity_confidence_floor": 2}, "entity_confidence_floor"),
        ({"entity_overlap_weight": -0.5}, "entity_overlap_weight"),
        ({"entity_overlap_weight": 2.01}, "entity_overlap_weight"),
        ({"type_affinity_weight": 3}, "type_affinity_weight"),
        ({"type_affinity_weight": False}, "type_affinity_weight"),
        ({"summarise_after_turns": 0}, "summarise_after_turns"),
        ({"summary_cooldown_seconds": -1}, "summary_cooldown_seconds"),
        ({"max_session_turns": 0}, "max_session_turns"),
        ({"max_session_turns": 10}, "max_session_turns"),
        ({"max_content_chars": 0}, "max_content_chars"),
        ({"rrf_k": 0}, "rrf_k"),
        ({"rrf_k": 60.5}, "rrf_k"),
        ({"relevance_threshold": 1.5}, "relevance_threshold"),
        ({"relevance_threshold": -0.1}, "relevance_threshold"),
        ({"relevance_threshold": "high"}, "relevance_threshold"),
        ({"budget": 5}, "BudgetSplit"),
        ({"budget": {"session": 0.5}}, "BudgetSplit"),
        ({"relevance_weights": {"dense": 1.0}}, "relevance_weights"),
    ],
)
def test_invalid_policy_raises_configuration_error(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(MemoryConfigurationError) as excinfo:
        MemoryPolicy(**changes)
    assert field in str(excinfo.value)
    assert not isinstance(excinfo.value, ValidationError)


def test_every_problem_is_reported() -> None:
    with pytest.raises(MemoryConfigurationError) as excinfo:
        bad: dict[str, Any] = {"recall_top_k": -1, "enabled": "no"}
        MemoryPolicy(**bad)
    message = str(excinfo.value)
    assert "recall_top_k" in message
    assert "enabled" in message


def test_model_validate_also_raises_configuration_error() -> None:
    with pytest.raises(MemoryConfigurationError, match="rrf_k"):
        MemoryPolicy.model_validate({"rrf_k": 0})
    with pytest.raises(MemoryConfigurationError, match="rrf_k"):
        MemoryPolicy.model_validate_json('{"rrf_k": -3}')


def test_with_changes_revalidates() -> None:
    policy = MemoryPolicy(budget=BudgetSplit())
    changed = policy.with_changes(recall_top_k=2)
    assert changed.recall_top_k == 2
    assert changed.budget == BudgetSplit()
    assert policy.recall_top_k == 6
    with pytest.raises(MemoryConfigurationError, match="summary_keep_messages"):
        policy.with_changes(recent_max_messages=4)


def test_round_trips_through_json() -> None:
    policy = MemoryPolicy(
        budget=BudgetSplit(), recall_scopes=(MemoryScope.SESSION,), relevance_threshold=0.3
    )
    assert MemoryPolicy.model_validate_json(policy.model_dump_json()) == policy


# --- budget split ---------------------------------------------------------------


def test_budget_split_defaults_sum_to_one() -> None:
    split = BudgetSplit()
    assert (split.session, split.episodic, split.system, split.current_turn) == (
        0.35,
        0.25,
        0.30,
        0.10,
    )
    assert abs(split.session + split.episodic + split.system + split.current_turn - 1) < 1e-9


def test_budget_split_tolerates_float_noise() -> None:
    split = BudgetSplit(session=0.1 + 0.2, episodic=0.3, system=0.3, current_turn=0.1 - 5e-7)
    assert split.session == pytest.approx(0.3)


@pytest.mark.parametrize(
    "shares",
    [
        {"session": 0.5},
        {"session": 0.3},
        {"session": -0.05, "episodic": 0.65},
        {"session": 1.1, "episodic": -0.45},
        {"session": "0.35"},
        {"session": True},
        {"session": float("nan")},
        {"everything": 1.0},
        {"current_turn": 0.1 + 2e-6},
    ],
)
def test_budget_split_invalid(shares: dict[str, Any]) -> None:
    with pytest.raises(MemoryConfigurationError, match="BudgetSplit"):
        BudgetSplit(**shares)


def test_budget_split_allocates_exactly() -> None:
    allowance = BudgetSplit().allocate(1000)
    assert allowance == BudgetAllowance(session=350, episodic=250, system=300, current_turn=100)
    assert allowance.total == 1000


@pytest.mark.parametrize("total", [0, 1, 7, 99, 101, 333, 4096, 128_000])
def test_budget_allocation_never_exceeds_a_share(total: int) -> None:
    split = BudgetSplit()
    allowance = split.allocate(total)
    assert allowance.total == total
    assert allowance.session <= split.session * total + 1e-6
    assert allowance.episodic <= split.episodic * total + 1e-6
    assert allowance.current_turn <= split.current_turn * total + 1e-6
    assert min(allowance) >= 0


def test_budget_allocation_floors_float_noise() -> None:
    allowance = BudgetSplit(session=0.29, episodic=0.31, system=0.3, current_turn=0.1).allocate(100)
    assert allowance.session == 29


def test_budget_allocation_zero_share() -> None:
    allowance = BudgetSplit(session=1.0, episodic=0.0, system=0.0, current_turn=0.0).allocate(10)
    assert allowance == BudgetAllowance(10, 0, 0, 0)


@pytest.mark.parametrize("total", [-1, 1.5, True, "100"])
def test_budget_allocation_rejects_bad_totals(total: Any) -> None:
    with pytest.raises(ValueError, match="total_tokens"):
        BudgetSplit().allocate(total)


def test_policy_allocate_budget() -> None:
    assert MemoryPolicy().allocate_budget(1000) is None
    split: Any = {"session": 0.5, "episodic": 0.2, "system": 0.2, "current_turn": 0.1}
    allowance = MemoryPolicy(budget=split).allocate_budget(1000)
    assert allowance == BudgetAllowance(500, 200, 200, 100)


def test_recall_request_defaults_are_the_policys() -> None:
    """RecallRequest repeats MemoryPolicy's ranking defaults (a request built by hand ranks
    as the default policy does); the two must not drift apart."""
    from dataclasses import fields

    from harbor_pg.context.recall import RecallRequest

    defaults = {f.name: f.default for f in fields(RecallRequest)}
    policy = MemoryPolicy()
    assert defaults["recency_half_life_hours"] == policy.recency_half_life_hours
    assert defaults["entity_weight"] == policy.entity_overlap_weight
    assert defaults["type_weight"] == policy.type_affinity_weight
    assert defaults["rrf_k"] == policy.rrf_k
    assert defaults["fusion"] == policy.recall_fusion
    assert defaults["max_sensitivity"] == policy.recall_max_sensitivity
