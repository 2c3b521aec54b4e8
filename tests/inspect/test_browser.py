"""The inspector in a real browser: Debian's headless Chromium, driven by Playwright.

One app and one browser for the module. Every page is loaded, searched and
screenshotted at 1280x800 and at a phone's 390x844 (into
tests/inspect/artifacts/, or $HARBOR_INSPECT_ARTIFACTS), with no horizontal
overflow at phone width; the identity is switched from dana to eve through
the identity page, and no page read as one of them holds the other's text
(nor the other tenant's).

Chromium comes from the system (``apt-get install chromium``); Playwright's
own browser download is never used. Without it these tests skip, unless
HARBOR_REQUIRE_CHROMIUM=1, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from harbor_pg.inspect import InspectorSettings
from tests.inspect.conftest import EVE_MARK, STRANGER_MARK, Seed, served

ARTIFACTS = Path(os.environ.get("HARBOR_INSPECT_ARTIFACTS") or Path(__file__).parent / "artifacts")
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
DANA_TEXT = "Dana owns the ingest pipeline"


def _chromium() -> str:
    found = shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )
    reason = None
    if found is None:
        reason = "chromium is not installed: apt-get install chromium"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is missing: pip install -e '.[dev]'"
    if reason is not None:
        if os.environ.get("HARBOR_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"HARBOR_REQUIRE_CHROMIUM=1 but {reason}")
        pytest.skip(reason)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def browser(app_url: str) -> Iterator[Any]:
    # after the app (and the seeding, which runs its own event loop): Playwright's
    # synchronous API keeps a loop running in this thread while the browser is open
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def app_url(seeded: Seed) -> Iterator[str]:
    with served(seeded.db, InspectorSettings(tenant="acme")) as url:
        yield url


class Visitor:
    """One browser context (its cookies are the chosen identity) that keeps every page's
    HTML and screenshots each page at both widths."""

    def __init__(self, browser: Any, base: str) -> None:
        self.context = browser.new_context(viewport=DESKTOP)
        self.context.set_default_timeout(15_000)
        self.page = self.context.new_page()
        self.base = base
        self.html: dict[str, str] = {}

    def goto(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None
        self.page.wait_for_load_state("load")
        return response

    def keep(self, name: str) -> str:
        """Record the page as it is now: its HTML, a screenshot per width, the phone check."""
        page = self.page
        html = str(page.content())
        self.html[name] = html
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.set_viewport_size(DESKTOP)
        page.screenshot(path=str(ARTIFACTS / f"{name}-1280x800.png"))
        page.set_viewport_size(PHONE)
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{name}: {overflow}px of horizontal overflow at 390 px wide"
        page.screenshot(path=str(ARTIFACTS / f"{name}-390x844.png"), full_page=True)
        page.set_viewport_size(DESKTOP)
        return html

    def close(self) -> None:
        self.context.close()


def _choose(v: Visitor, user: str, session: str | None = None) -> None:
    """Pick an identity on the identity page, as a person would."""
    v.goto("/identity")
    button = v.page.locator(f'button.pick[data-identity="{user}/{session or ""}/"]')
    assert button.count() == 1, v.page.content()
    button.click()
    v.page.wait_for_load_state("load")
    assert v.page.url.endswith("/memories")


def test_every_page_in_chromium(browser: Any, app_url: str, seeded: Seed) -> None:
    v = Visitor(browser, app_url)
    try:
        # no identity yet: any page leads to the identity page, which lists the tenant's
        v.goto("/memories")
        assert "/identity" in v.page.url
        v.keep("identity")
        assert v.page.locator("button.pick").count() >= 3
        _choose(v, "dana", "s1")

        # memories: every current one of dana's, search, filters, as of a past time
        v.goto("/memories")
        text = v.keep("memories")
        assert DANA_TEXT in text and "runs on Kafka" in text and "runs on RabbitMQ" not in text
        v.page.fill("input[name=q]", "kafka")
        v.page.click("form.filters button[type=submit]")
        v.page.wait_for_load_state("load")
        found = v.page.locator("ol.memories li.memory a.content").all_inner_texts()
        assert "The ingest pipeline runs on Kafka" in found  # (and the session's summary)
        assert found and all("kafka" in f.lower() for f in found)
        assert "The ingest pipeline runs on RabbitMQ" not in found  # superseded: not current
        v.keep("memories-search")
        v.goto("/memories?type=preference")
        assert v.page.locator("ol.memories li.memory").count() == 1
        v.goto("/memories?sensitivity=pii")
        assert "Harbour Lane" in v.page.content()
        v.goto("/memories?source=tool%3Acron")
        assert v.page.locator("ol.memories li.memory").count() == 8
        v.goto("/memories?as_of=" + quote(seeded.before_kafka.isoformat()))
        v.keep("memories-as-of")
        past = v.page.locator("ol.memories li.memory a.content").all_inner_texts()
        assert "The ingest pipeline runs on RabbitMQ" in past
        assert "The ingest pipeline runs on Kafka" not in past

        # a memory: the supersession timeline, provenance turns, entities
        v.goto(f"/memories/{seeded.kafka}")
        page = v.keep("memory")
        assert v.page.locator("ol.timeline li").count() == 2
        assert "runs on RabbitMQ" in v.page.locator("ol.timeline").inner_text()
        assert "replaced v1" in page
        turns = v.page.locator("section.card ol.turns li")
        assert turns.count() == 2 and "RabbitMQ to Kafka" in turns.first.inner_text()
        assert v.page.locator("a.tag.entity", has_text="ingest").count() >= 1
        v.page.locator("ol.turns li a").first.click()  # provenance links to the session
        v.page.wait_for_load_state("load")
        assert "/session?session=s1" in v.page.url
        v.goto(f"/memories/{seeded.rabbit}")
        old = v.page.locator("ol.timeline").inner_text()
        assert "replaced by v2" in old and "runs on Kafka" in old

        # why this ranking: signals drawn per memory, the budget cut, the losers
        v.goto("/ranking")
        v.page.fill("input[name=q]", "who owns the ingest pipeline")
        v.page.fill("input[name=k]", "3")
        v.page.fill("input[name=budget]", "20")
        v.page.click("form.filters button[type=submit]")
        v.page.wait_for_load_state("load")
        ranking = v.keep("ranking")
        items = v.page.locator("li.ranked-item")
        assert items.count() > 3
        assert v.page.locator("li.fate-returned").count() >= 1
        assert v.page.locator("li.fate-budget").count() >= 1
        assert v.page.locator("li.fate-lost").count() >= 1
        assert v.page.locator("li.cut.budget-cut").count() == 1
        assert v.page.locator("li.cut.k-cut").count() == 1
        first = items.first
        assert first.locator("svg.signals rect.bar").count() == 8
        labels = first.locator("svg.signals text.label").all_text_contents()
        assert labels == [
            "dense rank", "lexical rank", "fused relevance", "recency", "importance",
            "entity", "type", "final score",
        ]  # fmt: skip
        assert DANA_TEXT in first.inner_text()
        assert "dense leg <b>on</b>" in ranking
        # no note: the dense leg ran, and the wider call ranked the same pool (its first
        # rows are what recall returned)
        assert v.page.locator("p.note").count() == 0, v.page.locator("p.note").all_inner_texts()

        # a session: turns, the summary's frontier, working state with its expiry
        v.goto("/session?session=s1&run=r1")
        session = v.keep("session")
        assert v.page.locator("li.turn").count() == 9
        assert v.page.locator("li.cut.frontier").count() == 1
        assert v.page.locator("li.turn.covered").count() >= 1
        assert "drafting the migration plan" in session
        assert re.search(r"<b>in (59|5\d) min</b>", session), "an expiry about an hour ahead"

        # switch to eve: her memory, none of dana's
        _choose(v, "eve")
        eve_pages = {}
        for name, path in [
            ("eve-memories", "/memories"),
            ("eve-search", "/memories?q=pipeline"),
            ("eve-ranking", "/ranking?q=pipeline&k=3"),
            ("eve-session", "/session?session=e1"),
        ]:
            v.goto(path)
            eve_pages[name] = v.keep(name)
        assert EVE_MARK in eve_pages["eve-memories"]
        v.goto(f"/memories/{seeded.kafka}")  # dana's memory, by its id
        assert "No memory with that id is visible" in v.page.content()
        eve_pages["eve-dana-memory"] = v.page.content()

        for name, html in v.html.items():
            assert STRANGER_MARK not in html, name
            if name.startswith("eve"):
                assert DANA_TEXT not in html and "Harbour Lane" not in html, name
            else:
                assert EVE_MARK not in html, name
        for name, html in eve_pages.items():
            assert DANA_TEXT not in html and "runs on Kafka" not in html, name
    finally:
        v.close()


def _serving(html: str) -> Any:
    """A route handler that answers with ``html`` (the attacker's page)."""

    def fulfil(route: Any) -> None:
        route.fulfill(body=html, content_type="text/html")

    return fulfil


def test_another_sites_form_cannot_switch_the_identity(browser: Any, app_url: str) -> None:
    """An attacker's page (another site) auto-submits a form to /identity and to /login in
    a browser that has a chosen identity: both are refused, and the identity stays."""
    v = Visitor(browser, app_url)
    try:
        _choose(v, "dana", "s1")
        chosen = {c["name"]: c["value"] for c in v.context.cookies()}
        eve = '<input name="tenant_id" value="acme"><input name="user_id" value="eve">'
        for path, fields in (
            ("/identity", eve),
            ("/login", '<input name="token" value="attacker-token">'),
        ):
            attack = (
                f'<form id="f" method="post" action="{app_url}{path}">{fields}</form>'
                '<script>document.getElementById("f").submit()</script>'
            )
            v.context.route("http://attacker.example/**", _serving(attack))
            with v.page.expect_navigation(url=f"{app_url}{path}") as landed:
                v.page.goto("http://attacker.example/")
            response = landed.value
            assert response is not None and response.status == 403, path
            v.context.unroute("http://attacker.example/**")
        assert {c["name"]: c["value"] for c in v.context.cookies()} == chosen
        assert DANA_TEXT in v.goto("/memories").text()
    finally:
        v.close()


def test_without_chromium_the_browser_tests_skip_or_fail_as_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(Path, "exists", lambda self: False)
    monkeypatch.delenv("HARBOR_REQUIRE_CHROMIUM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        _chromium()
    monkeypatch.setenv("HARBOR_REQUIRE_CHROMIUM", "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium"):
        _chromium()
