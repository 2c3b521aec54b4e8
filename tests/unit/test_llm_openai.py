"""OpenAIModel against the local OpenAI-protocol stub."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import BaseModel, Field

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm import (
    MemoryModel,
    MemoryModelError,
    OpenAIModel,
    StructuredOutputUnsupportedError,
    supports_structured_output,
)
from harbor_pg.llm._schema import strict_schema
from tests.openai_stub import CHAT_PATH, OpenAIStub


class Fact(BaseModel):
    content: str
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    entities: list[str] = Field(default_factory=list, max_length=10)


class Facts(BaseModel):
    facts: list[Fact]
    note: str | None = None


class Loose(BaseModel):
    metadata: dict[str, Any]


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        yield server


@pytest.fixture
async def model(stub: OpenAIStub) -> AsyncIterator[OpenAIModel]:
    built = OpenAIModel(
        "stub-model", api_key=stub.api_key, base_url=stub.base_url, timeout=5.0, max_retries=0
    )
    yield built
    await built.aclose()


def _only_request(stub: OpenAIStub) -> dict[str, Any]:
    requests = stub.requests_to(CHAT_PATH)
    assert len(requests) == 1
    payload = requests[0].json
    assert isinstance(payload, dict)
    return payload


async def test_text_success_sends_system_and_user(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_text("Alice owns the ingest pipeline.")
    answer = await model.generate_text("You summarise.", "Who owns ingest?")
    assert answer == "Alice owns the ingest pipeline."
    payload = _only_request(stub)
    assert payload["model"] == "stub-model"
    assert payload["messages"] == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "Who owns ingest?"},
    ]
    assert "response_format" not in payload


async def test_structured_success_uses_strict_json_schema(
    stub: OpenAIStub, model: OpenAIModel
) -> None:
    stub.chat_json(
        {"facts": [{"content": "Bob prefers tea", "importance": 0.8, "entities": []}], "note": None}
    )
    result = await model.generate_structured("Extract facts.", "Bob: I prefer tea.", Facts)
    assert result == Facts(facts=[Fact(content="Bob prefers tea", importance=0.8)])

    payload = _only_request(stub)
    assert payload["messages"][0] == {"role": "system", "content": "Extract facts."}
    assert payload["messages"][1] == {"role": "user", "content": "Bob: I prefer tea."}
    response_format = payload["response_format"]
    assert response_format["type"] == "json_schema"
    spec = response_format["json_schema"]
    assert spec["name"] == "Facts"
    assert spec["strict"] is True
    schema = spec["schema"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"facts", "note"}
    fact = schema["$defs"]["Fact"]
    assert fact["additionalProperties"] is False
    assert set(fact["required"]) == {"content", "importance", "entities"}
    assert "default" not in fact["properties"]["importance"]
    assert "maxItems" in fact["properties"]["entities"]


async def test_open_dict_schema_is_sent_non_strict(stub: OpenAIStub, model: OpenAIModel) -> None:
    assert strict_schema(Loose) is None
    stub.chat_json({"metadata": {"k": 1}})
    result = await model.generate_structured("s", "u", Loose)
    assert result.metadata == {"k": 1}
    spec = _only_request(stub)["response_format"]["json_schema"]
    assert spec["strict"] is False


async def test_malformed_json(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_text('{"facts": [ {"content": "unterminated')
    with pytest.raises(MemoryModelError, match="malformed JSON for Facts"):
        await model.generate_structured("s", "u", Facts)


async def test_schema_mismatch(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_json({"facts": [{"content": "x", "importance": 7}]})
    with pytest.raises(MemoryModelError, match=r"does not match Facts: facts\.0\.importance"):
        await model.generate_structured("s", "u", Facts)


async def test_fenced_json_is_accepted(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_text('```json\n{"facts": []}\n```')
    assert await model.generate_structured("s", "u", Facts) == Facts(facts=[])


async def test_truncated_structured_output(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_text('{"facts": [', finish_reason="length")
    with pytest.raises(MemoryModelError, match="token limit"):
        await model.generate_structured("s", "u", Facts)


async def test_refusal(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_refusal("I can't help with that.")
    with pytest.raises(MemoryModelError, match="refused: I can't help with that"):
        await model.generate_structured("s", "u", Facts)
    stub.chat_refusal("No.")
    with pytest.raises(MemoryModelError, match="refused"):
        await model.generate_text("s", "u")


async def test_empty_answer(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.chat_text("   ")
    with pytest.raises(MemoryModelError, match="empty answer"):
        await model.generate_text("s", "u")


async def test_timeout(stub: OpenAIStub) -> None:
    slow = OpenAIModel(
        "stub-model", api_key=stub.api_key, base_url=stub.base_url, timeout=0.3, max_retries=0
    )
    stub.delay(CHAT_PATH, 3.0)
    started = time.monotonic()
    try:
        with pytest.raises(MemoryModelError, match=r"timed out after 0\.3s") as info:
            await slow.generate_text("s", "u")
    finally:
        await slow.aclose()
    assert time.monotonic() - started < 2.5
    assert info.value.status_code is None


async def test_rate_limited(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.error(CHAT_PATH, 429, "Rate limit reached for requests")
    with pytest.raises(MemoryModelError, match="rate limited") as info:
        await model.generate_text("s", "u")
    assert info.value.status_code == 429
    assert "Rate limit reached" in str(info.value)


async def test_server_error(stub: OpenAIStub, model: OpenAIModel) -> None:
    stub.error(CHAT_PATH, 500, "The server had an error while processing your request.")
    with pytest.raises(MemoryModelError, match="HTTP 500") as info:
        await model.generate_structured("s", "u", Facts)
    assert info.value.status_code == 500


async def test_error_message_never_contains_the_key(stub: OpenAIStub) -> None:
    key = "sk-proj-SECRETSECRETSECRET1234"
    leaky = OpenAIModel("stub-model", api_key=key, base_url=stub.base_url, max_retries=0)
    stub.error(CHAT_PATH, 401, f"Incorrect API key provided: {key}.")
    try:
        with pytest.raises(MemoryModelError) as info:
            await leaky.generate_text("s", "u")
    finally:
        await leaky.aclose()
    assert info.value.status_code == 401
    assert "SECRET" not in str(info.value)
    assert "SECRET" not in repr(leaky)


async def test_connection_refused(stub: OpenAIStub) -> None:
    base_url = stub.base_url
    stub.stop()
    dead = OpenAIModel("stub-model", api_key="sk-x", base_url=base_url, max_retries=0)
    try:
        with pytest.raises(MemoryModelError, match="could not connect"):
            await dead.generate_text("s", "u")
    finally:
        await dead.aclose()


async def test_retries_recover_from_a_500(stub: OpenAIStub) -> None:
    retrying = OpenAIModel("stub-model", api_key="sk-x", base_url=stub.base_url, max_retries=1)
    stub.error(CHAT_PATH, 500, "transient")
    stub.chat_text("second try")
    try:
        assert await retrying.generate_text("s", "u") == "second try"
    finally:
        await retrying.aclose()
    assert len(stub.requests_to(CHAT_PATH)) == 2


async def test_json_object_mode_puts_the_schema_in_the_prompt(stub: OpenAIStub) -> None:
    compat = OpenAIModel(
        "stub-model",
        api_key="sk-x",
        base_url=stub.base_url,
        max_retries=0,
        structured_output="json_object",
    )
    stub.chat_json({"facts": []})
    try:
        assert await compat.generate_structured("Extract.", "u", Facts) == Facts(facts=[])
    finally:
        await compat.aclose()
    payload = _only_request(stub)
    assert payload["response_format"] == {"type": "json_object"}
    assert payload["messages"][0]["content"].startswith("Extract.")
    assert '"facts"' in payload["messages"][0]["content"]


async def test_structured_off(stub: OpenAIStub) -> None:
    plain = OpenAIModel("m", api_key="sk-x", base_url=stub.base_url, structured_output="off")
    try:
        assert not supports_structured_output(plain)
        with pytest.raises(StructuredOutputUnsupportedError):
            await plain.generate_structured("s", "u", Facts)
    finally:
        await plain.aclose()
    assert stub.requests == []


async def test_protocol_and_config_errors(
    model: OpenAIModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(model, MemoryModel)
    assert supports_structured_output(model)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(MemoryConfigurationError, match="OPENAI_API_KEY"):
        OpenAIModel()
    with pytest.raises(MemoryConfigurationError, match="timeout"):
        OpenAIModel(api_key="sk-x", timeout=0)


def test_missing_openai_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # makes `import openai` fail
    with pytest.raises(MemoryConfigurationError, match=r"pip install 'harbor-pg\[openai\]'"):
        OpenAIModel(api_key="sk-x")


async def test_given_client_and_unexpected_errors(
    stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai

    client = openai.AsyncOpenAI(api_key=stub.api_key, base_url=stub.base_url, max_retries=0)
    model = OpenAIModel("stub-model", client=client)
    try:
        stub.chat_text("via the given client")
        assert await model.generate_text("s", "u") == "via the given client"

        async def explode(**kwargs: Any) -> Any:
            raise RuntimeError(f"unexpected, with {stub.api_key}")

        monkeypatch.setattr(client.chat.completions, "create", explode)
        with pytest.raises(MemoryModelError, match="RuntimeError: unexpected") as info:
            await model.generate_text("s", "u")
        assert stub.api_key not in str(info.value)
    finally:
        await model.aclose()  # does not close a client it did not build
        assert not client.is_closed()
        await client.close()
