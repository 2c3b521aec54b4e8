"""Queued jobs that fail: retries with backoff, errors kept, broken output repaired once,
a killed worker's job run again, and no fact written twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.jobs import EXTRACT_SESSION_TASK, RAW_OUTPUT_CHARS
from harbor_pg.llm.base import MemoryModelError, StructuredOutputUnsupportedError
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from tests.conftest import PgDatabase, run_cli
from tests.integration.test_jobs_append import TeaModel

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
FACT = {
    "content": "The user drinks green tea every morning",
    "type": "preference",
    "scope": "user",
    "importance": 0.7,
    "entities": [],
    "sensitivity": "none",
}
QUICK = MemoryManagerConfig(job_retries=3, job_retry_seconds=0)


class FlakyModel:
    """Fails ``failures`` times as a rate-limited model does, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise MemoryModelError("rate limited", status_code=429)
        return schema.model_validate({"facts": [FACT]})


class TextModel:
    """Answers in text (no structured output) from a script of answers."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise StructuredOutputUnsupportedError("text only")


def job_state(db: PgDatabase) -> tuple[str, int, list[tuple[int, str, str | None]]]:
    with psycopg.connect(db.admin_url) as conn:
        row: Any = conn.execute(
            "select id, status::text, attempts from harbor_jobs.procrastinate_jobs"
            " where task_name = %s",
            (EXTRACT_SESSION_TASK,),
        ).fetchone()
        errors = conn.execute(
            "select attempt, error, raw_output from harbor_jobs.job_errors"
            " where job_id = %s order by attempt",
            (row[0],),
        ).fetchall()
    return row[1], row[2], [(e[0], e[1], e[2]) for e in errors]


async def run_one_turn(database: Database, model: Any, config: MemoryManagerConfig) -> Any:
    manager = MemoryManager.from_database(
        database, extraction_model=model, embedder=HashingEmbedder(), config=config
    )
    try:
        await manager.append(DANA, ConversationMessage(role="user", content="green tea, daily"))
        await asyncio.wait_for(manager.drain(), timeout=60)
        return [m.content for m in await manager.search(DANA, "drinks")]
    finally:
        await manager.close()


async def test_a_failing_model_is_retried_and_each_failure_is_kept(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = FlakyModel(failures=2)
    stored = await run_one_turn(database, model, QUICK)
    assert stored == [FACT["content"]]
    status, attempts, errors = job_state(fresh_db)
    assert (status, attempts, model.calls) == ("succeeded", 3, 3)
    assert [(a, e) for a, e, _raw in errors] == [
        (0, "MemoryModelError: rate limited"),
        (1, "MemoryModelError: rate limited"),
    ]


async def test_retries_end_at_the_limit_and_the_job_stays_failed_with_its_error(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = FlakyModel(failures=100)
    config = MemoryManagerConfig(job_retries=1, job_retry_seconds=0)
    assert await run_one_turn(database, model, config) == []
    status, attempts, errors = job_state(fresh_db)
    assert (status, attempts, model.calls) == ("failed", 2, 2)
    assert [a for a, _e, _r in errors] == [0, 1]


def test_the_backoff_doubles() -> None:
    from harbor_pg.jobs import _backoff

    class Job:
        def __init__(self, attempts: int) -> None:
            self.attempts = attempts

    strategy = _backoff(3, 2.0)
    waits = []
    for attempts in range(4):
        decision = strategy.get_retry_decision(exception=RuntimeError(), job=Job(attempts))
        waits.append(None if decision is None else decision.retry_at)
    assert waits[3] is None  # the limit
    first, second, third = (w.timestamp() - time.time() for w in waits[:3])
    assert 1.5 < first < 2.5 and 3.5 < second < 4.5 and 7.5 < third < 8.5


async def test_broken_json_gets_one_repair_attempt(
    database: Database, fresh_db: PgDatabase
) -> None:
    import json

    model = TextModel("Sure! Here are the facts: {facts: [oops", json.dumps({"facts": [FACT]}))
    assert await run_one_turn(database, model, QUICK) == [FACT["content"]]
    assert model.calls == 2
    status, _attempts, errors = job_state(fresh_db)
    assert (status, errors) == ("succeeded", [])


async def test_output_still_broken_after_the_repair_fails_the_job_with_it_kept(
    database: Database, fresh_db: PgDatabase
) -> None:
    broken = "no JSON here, only prose " * 1000
    model = TextModel(broken)
    assert await run_one_turn(database, model, QUICK) == []
    assert model.calls == 2  # the answer and its one repair attempt; no retries
    status, attempts, errors = job_state(fresh_db)
    assert (status, attempts) == ("failed", 1)
    [(attempt, error, raw)] = errors
    assert attempt == 0 and "after one repair attempt" in error
    assert raw == broken[:RAW_OUTPUT_CHARS]


async def test_a_rerun_writes_nothing_twice(database: Database) -> None:
    model = FlakyModel(failures=0)
    manager = MemoryManager.from_database(
        database, extraction_model=model, embedder=HashingEmbedder(), config=QUICK
    )
    try:
        turn = await manager.append(DANA, ConversationMessage(role="user", content="tea"))
        await asyncio.wait_for(manager.drain(), timeout=60)
        assert turn.id is not None
        await manager.run_extraction_job(DANA, int(turn.id))  # the same job, run again
        assert model.calls == 2
        assert [m.content for m in await manager.search(DANA, "drinks")] == [FACT["content"]]
    finally:
        await manager.close()


async def test_a_worker_killed_mid_job_has_its_job_run_again(
    database: Database, fresh_db: PgDatabase
) -> None:
    queueing = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    await queueing.append(DANA, ConversationMessage(role="user", content="green tea"))
    env = {**os.environ, "HARBOR_DATABASE_URL": fresh_db.superuser_url}
    env.pop("HARBOR_ADMIN_DATABASE_URL", None)
    slow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harbor_pg.cli",
            "worker",
            "--manager",
            "tests.integration.jobs_worker_app:slow_manager",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while job_state(fresh_db)[0] != "doing":
            assert slow.poll() is None and time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        os.kill(slow.pid, signal.SIGKILL)
        slow.wait()
    await asyncio.sleep(1.5)  # its heartbeat is now older than job_stalled_seconds
    model = TeaModel()
    rescuer = MemoryManager.from_database(
        database,
        extraction_model=model,
        embedder=HashingEmbedder(),
        config=MemoryManagerConfig(jobs_in_process=False, job_stalled_seconds=1.0),
    )
    try:
        await asyncio.wait_for(rescuer.run_worker(wait=False), timeout=60)
    finally:
        await rescuer.close()
    assert job_state(fresh_db)[0] == "succeeded"
    assert model.calls == 1
    stored = [m.content for m in await queueing.search(DANA, "drinks")]
    assert stored == ["The user drinks green tea every morning"]


async def test_harbor_pg_jobs_shows_failures_and_retries_or_cancels(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = TextModel("not JSON at all")
    assert await run_one_turn(database, model, QUICK) == []
    queueing = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    await queueing.append(DANA, ConversationMessage(role="user", content="more tea"))
    with psycopg.connect(fresh_db.admin_url) as conn:
        rows = conn.execute(
            "select id, status::text from harbor_jobs.procrastinate_jobs"
            " where task_name = %s order by id",
            (EXTRACT_SESSION_TASK,),
        ).fetchall()
    [(failed_id, first), (queued_id, second)] = rows
    assert (first, second) == ("failed", "todo")

    shown = run_cli("jobs", url=fresh_db.superuser_url)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert f"{EXTRACT_SESSION_TASK:<28} failed     1" in shown.stdout
    assert f"{EXTRACT_SESSION_TASK:<28} todo       1" in shown.stdout
    assert f"#{failed_id} {EXTRACT_SESSION_TASK} after 1 run(s): MemoryModelError:" in shown.stdout
    assert "(the model's answer is kept)" in shown.stdout

    assert run_cli("jobs", "retry", str(failed_id), url=fresh_db.superuser_url).returncode == 0
    assert run_cli("jobs", "cancel", str(queued_id), url=fresh_db.superuser_url).returncode == 0
    again = run_cli("jobs", "retry", str(queued_id), url=fresh_db.superuser_url)
    assert again.returncode != 0 and "is not a failed harbor-pg job" in again.stderr
    with psycopg.connect(fresh_db.admin_url) as conn:
        states = conn.execute(
            "select id, status::text from harbor_jobs.procrastinate_jobs"
            " where task_name = %s order by id",
            (EXTRACT_SESSION_TASK,),
        ).fetchall()
    assert states == [(failed_id, "todo"), (queued_id, "cancelled")]


class CountingModel:
    """Records the turns of each extraction's prompt (``windows``: the first and the
    newest) and proposes one fact naming each turn it shows."""

    def __init__(self) -> None:
        self.turns: list[int] = []
        self.windows: list[tuple[int, int]] = []

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        import re

        shown = [int(n) for n in re.findall(r"turn-(\d+)", user)]
        self.turns.extend(shown)
        self.windows.append((shown[0], shown[-1]))
        await asyncio.sleep(0)
        facts = [
            {**FACT, "content": f"The user said fact number {turn}", "scope": "session"}
            for turn in shown
        ]
        return schema.model_validate({"facts": facts})


async def test_four_workers_extract_every_turn_exactly_once(
    database: Database, fresh_db: PgDatabase
) -> None:
    """1,000 turns over 100 sessions queued before the workers start: a job a session
    (its turns share the one waiting), each turn in one model call, none in two."""
    turns, sessions = 1000, 100
    queueing = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    owners = [DANA.model_copy(update={"session_id": f"s{i}"}) for i in range(sessions)]
    for n in range(turns):
        await queueing.append(
            owners[n % sessions], ConversationMessage(role="user", content=f"turn-{n}")
        )
    model = CountingModel()
    fast = MemoryManagerConfig(jobs_in_process=False, job_poll_seconds=0.02)
    workers = [
        MemoryManager.from_database(database, extraction_model=model, config=fast) for _ in range(4)
    ]
    await work_off(fresh_db, workers, concurrency=2)
    assert sorted(model.turns) == list(range(turns))  # each turn once, none twice
    with psycopg.connect(fresh_db.admin_url) as conn:
        states = conn.execute(
            "select status::text, count(*) from harbor_jobs.procrastinate_jobs"
            " where task_name = %s group by 1",
            (EXTRACT_SESSION_TASK,),
        ).fetchall()
    assert states == [("succeeded", sessions)]
    with psycopg.connect(fresh_db.superuser_url) as conn:
        [(stored, distinct)] = conn.execute(
            "select count(*), count(distinct content) from harbor.memories"
        ).fetchall()
    assert stored == distinct == turns


class GaugeModel(TeaModel):
    """Takes a moment to answer and records the most calls it had at once."""

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.most = 0

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.05)
            return await super().generate_structured(system, user, schema)
        finally:
            self.running -= 1


async def work_off(db: PgDatabase, workers: list[MemoryManager], *, concurrency: int) -> None:
    """Run ``workers`` (each waiting for jobs, as ``harbor-pg worker`` does) until no
    extraction job is queued or running, then stop and close them."""
    tasks = [
        asyncio.create_task(
            w.job_runner().run_worker(concurrency=concurrency, install_signal_handlers=False)
        )
        for w in workers
    ]
    try:
        deadline = time.monotonic() + 120
        while True:
            with psycopg.connect(db.admin_url) as conn:
                row: Any = conn.execute(
                    "select count(*) from harbor_jobs.procrastinate_jobs"
                    " where task_name = %s and status in ('todo', 'doing')",
                    (EXTRACT_SESSION_TASK,),
                ).fetchone()
            if row[0] == 0:
                break
            assert time.monotonic() < deadline and not any(t.done() for t in tasks)
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in workers:
            await w.close()


async def most_at_once(database: Database, db: PgDatabase, limit: int | None) -> int:
    config = MemoryManagerConfig(
        jobs_in_process=False, job_model_concurrency=limit, job_poll_seconds=0.02
    )
    queueing = MemoryManager.from_database(database, extraction_model=TeaModel(), config=config)
    for n in range(24):
        owner = DANA.model_copy(update={"session_id": f"g{limit}-{n}"})  # a job each
        await queueing.append(owner, ConversationMessage(role="user", content=f"tea {n}"))
    model = GaugeModel()
    workers = [
        MemoryManager.from_database(database, extraction_model=model, config=config)
        for _ in range(3)
    ]
    await work_off(db, workers, concurrency=4)
    assert model.calls == 24
    return model.most


async def test_a_model_concurrency_limit_holds_across_workers(
    database: Database, fresh_db: PgDatabase
) -> None:
    assert await most_at_once(database, fresh_db, None) > 2  # three workers, four jobs each
    assert await most_at_once(database, fresh_db, 2) == 2


def test_harbor_pg_worker_stops_cleanly_on_sigterm(fresh_db: PgDatabase) -> None:
    env = {**os.environ, "HARBOR_DATABASE_URL": fresh_db.superuser_url}
    env.pop("HARBOR_ADMIN_DATABASE_URL", None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "harbor_pg.cli", "worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # running: registered on the queue
            with psycopg.connect(fresh_db.admin_url) as conn:
                row: Any = conn.execute(
                    "select count(*) from harbor_jobs.procrastinate_workers"
                ).fetchone()
            if row[0] == 1:
                break
            assert worker.poll() is None and time.monotonic() < deadline, worker.stderr
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err[-2000:]
    with psycopg.connect(fresh_db.admin_url) as conn:
        left = conn.execute("select count(*) from harbor_jobs.procrastinate_workers").fetchone()
    assert left == (0,)  # it unregistered


async def test_a_backlog_longer_than_the_window_still_extracts_every_turn(
    database: Database, fresh_db: PgDatabase
) -> None:
    """30 turns of one session queued before any worker runs: one job, whose model calls
    read windows of the policy's 12 turns, the last one filled from the turns before."""
    queueing = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    for n in range(30):
        await queueing.append(DANA, ConversationMessage(role="user", content=f"turn-{n}"))
    model = CountingModel()
    fast = MemoryManagerConfig(jobs_in_process=False, job_poll_seconds=0.02)
    worker = MemoryManager.from_database(database, extraction_model=model, config=fast)
    await work_off(fresh_db, [worker], concurrency=1)
    assert model.windows == [(0, 11), (12, 23), (18, 29)]
    with psycopg.connect(fresh_db.admin_url) as conn:
        [(jobs,)] = conn.execute(
            "select count(*) from harbor_jobs.procrastinate_jobs where task_name = %s",
            (EXTRACT_SESSION_TASK,),
        ).fetchall()
    assert jobs == 1


class FailingSummaryModel:
    """A summary model that fails ``failures`` times, as an unreachable one does, then
    summarises."""

    def __init__(self, failures: int = 1_000) -> None:
        self.failures = failures
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise MemoryModelError("the summary model is unreachable", status_code=503)
        return "Dana listed the items of her budget."

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise StructuredOutputUnsupportedError("text only")


async def fold_with(
    database: Database, db: PgDatabase, model: FailingSummaryModel
) -> tuple[Any, list[Any], Any]:
    """Four turns (a fold due) and one worker run with ``model`` as the summary model,
    one retry at most: the fold job's (id, status, attempts), its errors, the summary."""
    from harbor_pg.jobs import FOLD_TASK
    from harbor_pg.policy import MemoryPolicy

    policy = MemoryPolicy(
        summarise_after_turns=4, summary_keep_messages=1, summary_cooldown_seconds=0
    )
    config = MemoryManagerConfig(
        summaries_on_queue=True, jobs_in_process=False, job_retries=1, job_retry_seconds=0
    )
    manager = MemoryManager.from_database(
        database, policy=policy, config=config, summary_model=model
    )
    try:
        for i in range(4):
            await manager.append(DANA, ConversationMessage(role="user", content=f"item {i}"))
        await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
        assert manager.long_term is not None
        summary = await manager.long_term.load_summary(DANA)  # type: ignore[attr-defined]
    finally:
        await manager.close()
    with psycopg.connect(db.admin_url) as conn:
        row: Any = conn.execute(
            "select id, status::text, attempts from harbor_jobs.procrastinate_jobs"
            " where task_name = %s",
            (FOLD_TASK,),
        ).fetchone()
        errors = conn.execute(
            "select attempt, error from harbor_jobs.job_errors where job_id = %s order by attempt",
            (row[0],),
        ).fetchall()
    return row, errors, summary


async def test_a_summary_fold_that_fails_ends_its_job_failed_with_its_error(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = FailingSummaryModel()
    row, errors, summary = await fold_with(database, fresh_db, model)
    # run twice (one retry), failed both times, each failure kept with the model's error
    assert (row[1], row[2], model.calls) == ("failed", 2, 2)
    assert errors == [
        (0, "MemoryModelError: the summary model is unreachable"),
        (1, "MemoryModelError: the summary model is unreachable"),
    ]
    assert summary is None


async def test_a_failed_fold_is_retried_and_folds(database: Database, fresh_db: PgDatabase) -> None:
    model = FailingSummaryModel(failures=1)
    row, errors, summary = await fold_with(database, fresh_db, model)
    # the failed run let go of the session's lease: the retry took it and folded
    assert (row[1], row[2], model.calls) == ("succeeded", 2, 2)
    assert errors == [(0, "MemoryModelError: the summary model is unreachable")]
    assert summary is not None and "budget" in summary.content
