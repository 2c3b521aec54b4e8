"""The limits a :class:`~harbor_pg.manager.MemoryManager` enforces before anything is written."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryScope
from harbor_pg.records import Sensitivity

__all__ = ["MemoryManagerConfig", "RetentionRule"]


class RetentionRule(BaseModel):
    """One retention limit of a tenant, as :meth:`~harbor_pg.manager.MemoryManager.apply_retention`
    takes it: delete the memories older than ``max_age_seconds`` (None: none by age), of
    ``scope`` only and/or at or above ``min_sensitivity`` when given, rolling summaries
    only with ``include_summaries``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_age_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    scope: MemoryScope | None = None
    min_sensitivity: Sensitivity | None = None
    include_summaries: bool = False

    @model_validator(mode="after")
    def _age_for_a_filter(self) -> RetentionRule:
        if self.max_age_seconds is None and (
            self.scope is not None or self.min_sensitivity is not None
        ):
            raise ValueError("a retention scope or sensitivity needs max_age_seconds")
        return self


class MemoryManagerConfig(BaseModel):
    """Limits the facade enforces before anything is written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: longest accepted content (turns and memories), in characters
    max_content_chars: int = Field(default=20_000, ge=1, le=1_000_000)
    #: default number of recent turns in a snapshot
    recent_limit: int = Field(default=12, ge=0)
    #: memories a snapshot recalls
    snapshot_top_k: int = Field(default=6, ge=0, le=1000)
    #: after each append, summarise the session in the background once it is due
    #: (MemoryPolicy.summarise_after_turns, summary_cooldown_seconds)
    summarise_in_background: bool = True
    #: run the jobs this manager queues (fact extraction after appends) itself, in its
    #: event loop; False: ``harbor-pg worker`` processes run them
    jobs_in_process: bool = True
    #: fold rolling summaries as jobs on the queue, queued with the turn that makes the
    #: session due (durable, run by whoever runs the jobs), not as tasks of this process;
    #: always so when the manager has an extraction_model
    summaries_on_queue: bool = False
    #: after each extraction job, queue a consolidation of the owner's user and project
    #: memories (MemoryManager.consolidate) that compares the memories stored since the
    #: extraction began; one pending per tenant, project and user. False: none
    consolidate_after_extraction: bool = False
    #: ... and after that consolidation, write observations of the owner's entities with
    #: the extraction_model (MemoryManager.observe). False: none
    observe_after_consolidation: bool = False
    #: when the periodic consolidation runs (cron, in the worker's time zone: UTC by
    #: default): it queues a consolidation (MemoryManager.consolidate, as each owner) of
    #: every owner key and writer with user or project memories written since its last
    #: run, however they were written (save, save_many, imports, extraction). None: never
    consolidation_cron: str | None = None
    #: runs after the first that a failed job gets (0: none) ...
    job_retries: int = Field(default=4, ge=0, le=100)
    #: ... the first after this many seconds, each later one after twice the wait before it
    job_retry_seconds: float = Field(default=2.0, ge=0, le=86_400)
    #: at most this many of the jobs this manager queues (they call its models) run at
    #: once, on every worker together: they are spread over this many locks, a session's
    #: always on the same one. None: a session's jobs run one at a time, sessions in
    #: parallel up to the workers' concurrency
    job_model_concurrency: int | None = Field(default=None, ge=1, le=10_000)
    #: a session's fact extraction starts this many seconds after the turn that queued it,
    #: and reads every turn appended until then: a conversation's turns of that while
    #: share one job (and the model's calls, one a window of the policy's
    #: recent_max_messages turns). 0: at once (turns still share a job while it waits for
    #: a worker). MemoryManager.drain waits for the extractions this manager runs itself,
    #: their delay included. On a distributed database each turn queues its own job, at once
    extraction_delay_seconds: float = Field(default=0.0, ge=0, le=86_400)
    #: how often an idle job worker looks again for jobs it could not take before (a
    #: session's next job once the one running ends, a retry come due); a newly queued job
    #: wakes it at once
    job_poll_seconds: float = Field(default=1.0, gt=0, le=3600)
    #: a job worker silent (no heartbeat) this many seconds is taken for dead, and the jobs
    #: it was running are run again by another
    job_stalled_seconds: float = Field(default=30.0, gt=0, le=86_400)
    #: hours of inactivity after which a session's recent turns expire (seed 004): they
    #: are invisible at once and apply_retention reclaims them; summaries and memories
    #: extracted from them stay. None: turns never expire.
    session_ttl_hours: float | None = Field(default=24.0, gt=0)
    #: retention, per tenant id: the rules the periodic retention job applies to that
    #: tenant (each one an apply_retention call; an empty list: only the expired working
    #: state, expired memories and the turns past the session TTL). The job runs on the
    #: queue's workers with *their* configuration: a tenant missing here is left alone
    retention: dict[str, tuple[RetentionRule, ...]] = Field(default_factory=dict)
    #: when the retention job runs (cron, in the worker's time zone: UTC by default)
    retention_cron: str = "23 * * * *"

    @property
    def session_ttl_seconds(self) -> float | None:
        """:attr:`session_ttl_hours` in seconds (None: never)."""
        return None if self.session_ttl_hours is None else self.session_ttl_hours * 3600.0

    @model_validator(mode="before")
    @classmethod
    def _moved_knobs(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_session_turns" in data:
            # one knob, one place: the policy caps every recent read (manager and builder)
            raise MemoryConfigurationError(
                "max_session_turns is a MemoryPolicy field: pass "
                "MemoryManager(policy=MemoryPolicy(max_session_turns=...))"
            )
        return data
