"""A scriptable local server speaking enough of the OpenAI HTTP protocol for tests.

Binds to 127.0.0.1 on a free port, in a background thread; nothing leaves the
machine. Serves ``POST /v1/chat/completions`` and ``POST /v1/embeddings``.
Each route answers from a queue of scripted replies and, when the queue is
empty, with a default (a fixed chat answer; deterministic unit vectors).

    with OpenAIStub() as stub:
        stub.chat_text("hello")
        model = OpenAIModel(base_url=stub.base_url, api_key=stub.api_key, max_retries=0)
        ...
        assert stub.requests[0].json["messages"][0]["role"] == "system"
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["CHAT_PATH", "EMBEDDINGS_PATH", "OpenAIStub", "RecordedRequest", "StubReply"]

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
DEFAULT_CHAT_ANSWER = "stub answer"


@dataclass(frozen=True)
class StubReply:
    """One scripted HTTP answer: status, JSON body (or raw bytes), and a delay first."""

    status: int = 200
    body: Any = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedRequest:
    """What the stub received."""

    path: str
    headers: dict[str, str]
    json: Any


def chat_completion(
    content: str | None, *, refusal: str | None = None, finish_reason: str = "stop"
) -> dict[str, Any]:
    """An OpenAI-shaped chat completion body."""
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "stub-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def stub_vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text`` (not semantic; for plumbing tests)."""
    raw: list[float] = []
    counter = 0
    while len(raw) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        raw.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    raw = raw[:dimensions]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


class OpenAIStub:
    """The stub server; use as a context manager, or call start() and stop()."""

    api_key = "sk-stub-test-key-0123456789"

    def __init__(self, default_dimensions: int = 8) -> None:
        self.default_dimensions = default_dimensions
        self.requests: list[RecordedRequest] = []
        self._queues: dict[str, deque[StubReply]] = {CHAT_PATH: deque(), EMBEDDINGS_PATH: deque()}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------

    def start(self) -> OpenAIStub:
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stub._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},  # so stop() returns promptly
            name="openai-stub",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; delayed replies are abandoned."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """The API root to give a client, e.g. ``http://127.0.0.1:54321/v1``."""
        if self._server is None:
            raise RuntimeError("the stub is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    # --- scripting -------------------------------------------------------

    def push(self, path: str, reply: StubReply) -> None:
        """Queue ``reply`` as the next answer on ``path``."""
        with self._lock:
            self._queues[path].append(reply)

    def chat_text(self, text: str, *, delay: float = 0.0, finish_reason: str = "stop") -> None:
        """Next chat answer: ``text`` as the message content."""
        body = chat_completion(text, finish_reason=finish_reason)
        self.push(CHAT_PATH, StubReply(body=body, delay=delay))

    def chat_json(self, value: Any) -> None:
        """Next chat answer: ``value`` serialised as JSON content."""
        self.chat_text(json.dumps(value))

    def chat_refusal(self, reason: str) -> None:
        """Next chat answer: a refusal (``message.refusal`` set, no content)."""
        self.push(CHAT_PATH, StubReply(body=chat_completion(None, refusal=reason)))

    def error(self, path: str, status: int, message: str, *, delay: float = 0.0) -> None:
        """Next answer on ``path``: an HTTP error with an OpenAI-style body."""
        kinds = {
            400: ("invalid_request_error", None),
            401: ("invalid_request_error", "invalid_api_key"),
            429: ("requests", "rate_limit_exceeded"),
        }
        error_type, code = kinds.get(status, ("server_error", None))
        self.push(
            path,
            StubReply(status=status, body=error_body(message, error_type, code), delay=delay),
        )

    def delay(self, path: str, seconds: float) -> None:
        """Next answer on ``path``: the default answer, after ``seconds``."""
        self.push(path, StubReply(body=None, delay=seconds))

    def embeddings(self, vectors: list[list[float]]) -> None:
        """Next embeddings answer: exactly ``vectors``."""
        self.push(EMBEDDINGS_PATH, StubReply(body=self._embedding_body(vectors)))

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """The recorded requests on ``path``, oldest first."""
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # --- serving ---------------------------------------------------------

    @staticmethod
    def _embedding_body(vectors: list[list[float]]) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "model": "stub-embedding",
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }

    def _default(self, path: str, payload: Any) -> StubReply:
        if path == CHAT_PATH:
            return StubReply(body=chat_completion(DEFAULT_CHAT_ANSWER))
        inputs = payload.get("input", []) if isinstance(payload, dict) else []
        if isinstance(inputs, str):
            inputs = [inputs]
        dims = payload.get("dimensions", self.default_dimensions)
        return StubReply(body=self._embedding_body([stub_vector(str(t), dims) for t in inputs]))

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        path = handler.path.split("?", 1)[0]
        with self._lock:
            self.requests.append(RecordedRequest(path, dict(handler.headers.items()), payload))
            queue = self._queues.get(path)
            reply = queue.popleft() if queue else None
        if path not in self._queues:
            reply = StubReply(status=404, body=error_body(f"no route {path}", "not_found"))
        elif reply is None:
            reply = self._default(path, payload)
        elif reply.body is None:
            reply = StubReply(
                status=reply.status, body=self._default(path, payload).body, delay=reply.delay
            )
        if reply.delay and self._stopping.wait(reply.delay):
            return  # stopping: abandon the reply
        body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. it timed out first)
