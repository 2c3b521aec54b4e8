"""The inspector's web application: Starlette, server-rendered HTML, no script needed.

Pages: ``/memories`` (filters, as-of time, full-text search), ``/memories/{id}``
(supersession timeline, provenance, entities), ``/ranking`` (why recall ranked
what it did), ``/session`` (turns, rolling summary, working state) and
``/identity`` (who the pages read as). Assets come from the package
(``static/``); templates are Jinja2 files beside this module, autoescaped.
See :mod:`harbor_pg.inspect.access` for the token rule and the identity gate.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import harbor_pg.inspect.charts as charts
from harbor_pg.access_tokens import AccessToken, TokenStore
from harbor_pg.errors import MemoryError, MemoryScopeError, MemoryValidationError
from harbor_pg.inspect.access import (
    IDENTITY_COOKIE,
    TOKEN_COOKIE,
    Gate,
    decode_identity,
    encode_identity,
    is_loopback,
    owner_from_fields,
    with_fields,
)
from harbor_pg.inspect.data import SCOPES, SENSITIVITIES, TYPES, Binding, Reader
from harbor_pg.owner import MemoryOwner

if TYPE_CHECKING:
    from harbor_pg.manager import MemoryManager

__all__ = ["InspectorSettings", "build_app"]

log = logging.getLogger("harbor_pg.inspect")

_MAX_FORM_BYTES = 16_384
_SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}


@dataclass(frozen=True)
class InspectorSettings:
    """How the inspector runs.

    ``host``: the address it is bound to; anything but a loopback address
    makes every request need a live access token (``require_token`` forces
    that on loopback too). ``tenant``: the tenant the identity page starts
    with. ``secure_cookies``: mark cookies Secure (behind an HTTPS proxy).
    """

    host: str = "127.0.0.1"
    port: int = 8766
    tenant: str | None = None
    require_token: bool | None = None
    secure_cookies: bool = False

    @property
    def needs_token(self) -> bool:
        """Whether a request needs an access token (the token rule)."""
        if self.require_token is not None:
            return self.require_token
        return not is_loopback(self.host)


@dataclass
class _Page:
    """One request that passed the gate: who it may be, and who it reads as."""

    request: Request
    gate: Gate
    owner: MemoryOwner | None
    token: AccessToken | None


Handler = Callable[["Inspector", _Page], Awaitable[Response]]


class Inspector:
    """The application's state: the reader, the token store, the templates."""

    def __init__(self, manager: MemoryManager, settings: InspectorSettings) -> None:
        self.manager = manager
        self.settings = settings
        self.reader = Reader(manager)
        assert manager.database is not None
        self.tokens = TokenStore(manager.database)
        self.binding = Binding(bound=False)
        self.env = Environment(
            loader=PackageLoader("harbor_pg.inspect", "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["when"] = _when
        self.env.filters["ago"] = _ago
        self.env.filters["q"] = lambda v: quote(str(v), safe="")

    async def start(self) -> None:
        """Read the login's binding once (what a bound login may be is fixed by it)."""
        self.binding = await self.reader.binding()

    # -- rendering ----------------------------------------------------------------------

    def render(self, page: _Page | None, name: str, status: int = 200, **ctx: Any) -> Response:
        template = self.env.get_template(name)
        html = template.render(
            page=page,
            owner=page.owner if page else None,
            gate=page.gate if page else None,
            token=page.token if page else None,
            needs_token=self.settings.needs_token,
            path=page.request.url.path if page else "",
            **ctx,
        )
        return HTMLResponse(html, status_code=status, headers=_SECURITY_HEADERS)

    def problem(self, page: _Page | None, status: int, message: str) -> Response:
        return self.render(page, "problem.html", status=status, message=message)

    # -- the gate -----------------------------------------------------------------------

    def _presented_token(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            return header[7:].strip() or None
        return request.cookies.get(TOKEN_COOKIE) or None

    async def gate_for(self, request: Request) -> tuple[Gate, AccessToken | None] | Response:
        """The request's gate, or the response refusing it (no live token)."""
        token: AccessToken | None = None
        text = self._presented_token(request)
        if self.settings.needs_token:
            found = await self.tokens.authenticate(text) if text else None
            if found is None:
                return self._refuse(request, "a live access token is needed here")
            token = found
        b = self.binding
        if token is not None and not token.is_admin:
            return Gate(exact=token.owner, why="fixed by your access token"), token
        if b.bound:
            return (
                Gate(
                    tenant=b.tenant_id,
                    bound=True,
                    project=b.project_id,
                    user=b.user_id,
                    why="fixed by this login's role binding",
                ),
                token,
            )
        if token is not None:
            why = "your administrator token's tenant"
            return Gate(tenant=token.owner.tenant_id, why=why), token
        return Gate(), None

    def _refuse(self, request: Request, message: str) -> Response:
        wants_html = "text/html" in request.headers.get("accept", "")
        if not wants_html or request.headers.get("authorization"):
            return Response(
                message + "\n",
                status_code=401,
                media_type="text/plain",
                headers={**_SECURITY_HEADERS, "www-authenticate": 'Bearer realm="harbor-pg"'},
            )
        target = "/login?" + urlencode({"next": _local_path(request)})
        return RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)

    def page(self, handler: Handler, *, identity: bool = True) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            gated = await self.gate_for(request)
            if isinstance(gated, Response):
                return gated
            gate, token = gated
            owner = gate.narrow(decode_identity(request.cookies.get(IDENTITY_COOKIE)))
            page = _Page(request, gate, owner, token)
            if identity and owner is None:
                target = "/identity?" + urlencode({"next": _local_path(request)})
                return RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)
            try:
                return await handler(self, page)
            except MemoryScopeError as exc:
                return self.problem(page, 403, f"This identity may not read that: {exc}")
            except MemoryValidationError as exc:
                return self.problem(page, 400, str(exc))
            except MemoryError as exc:
                log.warning("inspect: %s failed: %s", request.url.path, exc)
                return self.problem(page, 503, f"The database did not answer: {exc}")

        return endpoint


# -- pages ------------------------------------------------------------------------------


async def home(app: Inspector, page: _Page) -> Response:
    return RedirectResponse("/memories", status_code=303, headers=_SECURITY_HEADERS)


async def identity_page(app: Inspector, page: _Page) -> Response:
    request = page.request
    gate = page.gate
    if request.method == "POST":
        form = await _form(request)
        try:
            chosen = owner_from_fields(form)
        except MemoryScopeError as exc:
            return app.problem(page, 400, f"Not an identity: {exc}")
        if not gate.allows(chosen):
            return app.problem(page, 403, f"This identity cannot be chosen here ({gate.why}).")
        target = _safe_next(form.get("next")) or "/memories"
        response = RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)
        _set_cookie(app, response, IDENTITY_COOKIE, encode_identity(chosen))
        return response
    tenant = (
        gate.tenant
        or request.query_params.get("tenant")
        or (page.owner.tenant_id if page.owner else None)
        or app.settings.tenant
    )
    listed = None
    if tenant and not gate.fixed:
        try:
            listed = await app.reader.identities(tenant)
        except MemoryScopeError:
            listed = None
        if listed is not None:
            listed = [row for row in listed if gate.allows(row.owner)]
    return app.render(
        page,
        "identity.html",
        tenant=tenant,
        listed=listed,
        next=_safe_next(request.query_params.get("next")) or "",
        encode=encode_identity,
    )


async def memories_page(app: Inspector, page: _Page) -> Response:
    assert page.owner is not None
    params = page.request.query_params
    scope = _choice(params.get("scope"), SCOPES)
    memory_type = _choice(params.get("type"), TYPES)
    sensitivity = _choice(params.get("sensitivity"), SENSITIVITIES)
    source = (params.get("source") or "").strip()[:120] or None
    entity = (params.get("entity") or "").strip()[:200] or None
    q = (params.get("q") or "").strip()[:500] or None
    as_of = _parse_time(params.get("as_of"))
    all_versions = params.get("versions") == "all"
    rows = await app.reader.memories(
        page.owner,
        scope=scope,
        memory_type=memory_type,
        sensitivity=sensitivity,
        source=source,
        entity=entity,
        as_of=as_of,
        all_versions=all_versions,
        q=q,
    )
    facets = await app.reader.facets(page.owner)
    return app.render(
        page,
        "memories.html",
        rows=rows,
        facets=facets,
        f={
            "scope": scope or "",
            "type": memory_type or "",
            "sensitivity": sensitivity or "",
            "source": source or "",
            "entity": entity or "",
            "q": q or "",
            "as_of": _input_time(as_of),
            "versions": "all" if all_versions else "",
        },
        scopes=SCOPES,
        types=TYPES,
        sensitivities=SENSITIVITIES,
        as_of=as_of,
    )


async def memory_page(app: Inspector, page: _Page) -> Response:
    assert page.owner is not None
    memory_id = page.request.path_params["memory_id"]
    found = await app.reader.memory(page.owner, memory_id[:200])
    if found is None:
        return app.problem(page, 404, "No memory with that id is visible to this identity.")
    chain = found["chain"]
    now = datetime.now(UTC)
    ticks = charts.timeline([(c["valid_from"], c["invalid_at"]) for c in chain], now)
    turns: list[dict[str, Any]] = []
    provenance_note = ""
    source_session = found.get("source_session_id")
    source_ids = list(found.get("source_message_ids") or [])
    session_link = None
    if source_session:
        viewer = _session_owner(page, source_session)
        if viewer is None:
            provenance_note = (
                "The turns belong to a session this identity cannot open "
                f"({page.gate.why or 'another user'})."
            )
        elif found.get("source_user_id") not in (None, viewer.user_id):
            provenance_note = "The turns belong to another user's session: not shown."
        else:
            session_link = "/session?" + urlencode({"session": source_session})
            if source_ids:
                turns = await app.reader.source_turns(viewer, source_session, source_ids)
    # Same shape as memories_page's render call above: two templates' keywords, not a copy.
    return app.render(
        page,
        "memory.html",
        m=found,
        chain=list(zip(chain, ticks, strict=True)),
        turns=turns,
        source_ids=source_ids,
        provenance_note=provenance_note,
        session_link=session_link,
        now=now,
    )


async def ranking_page(app: Inspector, page: _Page) -> Response:
    assert page.owner is not None
    params = page.request.query_params
    question = (params.get("q") or "").strip()[:2000]
    top_k = _int(params.get("k"), 1, 100)
    budget = _int(params.get("budget"), 0, 1_000_000)
    as_of = _parse_time(params.get("as_of"))
    view = None
    bars: list[list[charts.Bar]] = []
    if question:
        view = await app.reader.ranking(
            page.owner, question, top_k=top_k, token_budget=budget, as_of=as_of
        )
        if view.request is not None and view.rows:
            top_rel = max(r.item.relevance for r in view.rows)
            top_score = max(r.item.score for r in view.rows)
            bars = [charts.signal_bars(r.item, view.request, top_rel, top_score) for r in view.rows]
    policy = app.manager.policy
    return app.render(
        page,
        "ranking.html",
        question=question,
        view=view,
        bars=bars,
        k=top_k or policy.recall_top_k,
        budget="" if budget is None else budget,
        as_of=_input_time(as_of),
        embedder=getattr(app.manager.embedder, "model_id", None),
    )


async def session_page(app: Inspector, page: _Page) -> Response:
    assert page.owner is not None
    params = page.request.query_params
    wanted = (params.get("session") or "").strip()[:200] or page.owner.session_id
    run = (params.get("run") or "").strip()[:200] or None
    listed = None
    if not page.gate.fixed and page.owner.user_id:
        with contextlib.suppress(MemoryError):
            listed = await app.reader.identities(page.owner.tenant_id)
    sessions = sorted(
        {
            r.owner.session_id
            for r in listed or []
            if r.owner.user_id == page.owner.user_id and r.owner.session_id
        }
    )
    if not wanted or not page.owner.user_id:
        return app.render(page, "session.html", data=None, sessions=sessions, runs=[], viewer=None)
    viewer = _session_owner(page, wanted, run)
    if viewer is None:
        return app.problem(page, 403, f"This identity cannot open that session ({page.gate.why}).")
    runs = sorted(
        {
            r.owner.run_id
            for r in listed or []
            if r.owner.user_id == viewer.user_id and r.owner.session_id == wanted and r.owner.run_id
        }
    )
    data = await app.reader.session(viewer)
    return app.render(
        page,
        "session.html",
        data=data,
        sessions=sessions,
        runs=runs,
        viewer=viewer,
        now=datetime.now(UTC),
    )


def _session_owner(page: _Page, session_id: str, run_id: str | None = None) -> MemoryOwner | None:
    """The page's identity moved to ``session_id`` (and ``run_id``), if the gate allows."""
    owner = page.owner
    if owner is None or owner.user_id is None:
        return None
    if session_id == owner.session_id and run_id is None:
        return owner
    try:
        moved = with_fields(owner, session_id=session_id, run_id=run_id)
    except MemoryScopeError:
        return None
    return moved if page.gate.allows(moved) else None


# -- login ------------------------------------------------------------------------------


async def login(request: Request) -> Response:
    app: Inspector = request.app.state.inspector
    if request.method == "GET":
        nxt = _safe_next(request.query_params.get("next")) or "/"
        return app.render(None, "login.html", next=nxt, error=None)
    form = await _form(request)
    nxt = _safe_next(form.get("next")) or "/"
    text = (form.get("token") or "").strip()
    found = await app.tokens.authenticate(text) if text else None
    if found is None:
        return app.render(None, "login.html", status=401, next=nxt, error="That token is not live.")
    response = RedirectResponse(nxt, status_code=303, headers=_SECURITY_HEADERS)
    _set_cookie(app, response, TOKEN_COOKIE, text)
    response.delete_cookie(IDENTITY_COOKIE)
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303, headers=_SECURITY_HEADERS)
    response.delete_cookie(TOKEN_COOKIE)
    response.delete_cookie(IDENTITY_COOKIE)
    return response


# -- helpers ----------------------------------------------------------------------------


def _set_cookie(app: Inspector, response: Response, name: str, value: str) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        secure=app.settings.secure_cookies,
        max_age=12 * 3600,
    )


async def _form(request: Request) -> dict[str, str]:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            raise MemoryValidationError("the form is too large")
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        raise MemoryValidationError("the form is not valid URL-encoded UTF-8") from None
    return {k: v[0] for k, v in parsed.items() if v}


def _local_path(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def _safe_next(value: str | None) -> str | None:
    """A redirect target on this site only (a path, never another origin)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return None
    return value[:2000]


def _choice(value: str | None, allowed: tuple[str, ...]) -> str | None:
    return value if value in allowed else None


def _int(value: str | None, low: int, high: int) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        number = int(value)
    except ValueError:
        raise MemoryValidationError(f"{value!r} is not a whole number") from None
    return min(max(number, low), high)


def _parse_time(value: str | None) -> datetime | None:
    """A time from a form field (``datetime-local`` gives no zone: read as UTC)."""
    if value is None or not value.strip():
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise MemoryValidationError(f"{value!r} is not a date and time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _input_time(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: datetime | None, now: datetime | None = None) -> str:
    """How long before (or after) now ``value`` is, in the largest fitting unit."""
    if value is None:
        return "never"
    delta = ((now or datetime.now(UTC)) - value).total_seconds()
    ahead = delta < 0
    seconds = abs(delta)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            text = f"{math.floor(seconds / size)} {unit}"
            break
    else:
        text = f"{int(seconds)} s"
    return f"in {text}" if ahead else f"{text} ago"


#: methods that change nothing, which any page may send (a link, an image)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SameOriginWrites:
    """ASGI middleware: a request that may change state (any method but GET, HEAD and
    OPTIONS: choosing an identity, logging in or out) is refused with 403 when a
    browser says it came from another origin.

    Browsers say so in ``Sec-Fetch-Site`` (anything but ``same-origin``, or ``none``
    for what the user typed or bookmarked), or, without it, in ``Origin`` (when it
    differs from the scheme and host the request was sent to). A request with
    neither is not a browser's cross-site request (a command-line client's) and
    passes. Without this, any web page the user visits could post a form to the
    inspector and switch the identity it shows, or log the user in with the
    attacker's token.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE_METHODS:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            if _cross_origin(headers, scope.get("scheme", "http")):
                response = Response(
                    "Refused: this request came from another site.",
                    status_code=403,
                    media_type="text/plain",
                    headers=_SECURITY_HEADERS,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _cross_origin(headers: dict[str, str], scheme: str) -> bool:
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.strip().lower() not in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None:
        return False
    host = headers.get("host", "")
    return origin.strip().lower() != f"{scheme}://{host}".lower()


def build_app(
    manager: MemoryManager,
    settings: InspectorSettings | None = None,
    *,
    close_manager: bool = False,
) -> Starlette:
    """The inspector as an ASGI application over ``manager`` (its PostgreSQL stores).

    ``close_manager``: close the manager when the application shuts down.
    """
    settings = settings or InspectorSettings()
    inspector = Inspector(manager, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await inspector.start()
        try:
            yield
        finally:
            if close_manager:
                await manager.close()

    routes = [
        Route("/", inspector.page(home, identity=False)),
        Route("/identity", inspector.page(identity_page, identity=False), methods=["GET", "POST"]),
        Route("/memories", inspector.page(memories_page)),
        Route("/memories/{memory_id:path}", inspector.page(memory_page)),
        Route("/ranking", inspector.page(ranking_page)),
        Route("/session", inspector.page(session_page)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("harbor_pg.inspect", "static")]), name="static"),
    ]
    middleware = [Middleware(SameOriginWrites)]
    if is_loopback(settings.host):
        # a page elsewhere cannot reach this one through a name it resolves to loopback
        hosts = ["127.0.0.1", "localhost", "::1", "[::1]", settings.host]
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=hosts))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.inspector = inspector
    return app
