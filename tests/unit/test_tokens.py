"""approximate_tokens and message_tokens."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from harbor_pg.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    NON_TEXT_BLOCK_TOKENS,
    TokenCounter,
    approximate_tokens,
    content_tokens,
    message_tokens,
)


def test_empty_is_zero() -> None:
    assert approximate_tokens("") == 0


def test_non_empty_is_at_least_one() -> None:
    assert approximate_tokens("a") == 1
    assert approximate_tokens(" ") == 1


def test_ascii_four_characters_per_token() -> None:
    assert approximate_tokens("abcd") == 1
    assert approximate_tokens("abcde") == 2
    assert approximate_tokens("x" * 400) == 100
    assert approximate_tokens("x" * 401) == 101


def test_non_ascii_counts_one_token_each() -> None:
    assert approximate_tokens("日本語") == 3
    assert approximate_tokens("é") == 1
    assert approximate_tokens("🙂🙂") == 2
    # mixed: 8 ASCII characters -> 2 tokens, plus 2 non-ASCII
    assert approximate_tokens("abcdefgh日本") == 4


def test_non_ascii_weighs_more_than_ascii_of_equal_length() -> None:
    ascii_text = "a" * 40
    cjk_text = "字" * 40
    assert approximate_tokens(cjk_text) == 40
    assert approximate_tokens(ascii_text) == 10


def test_content_tokens_for_blocks() -> None:
    blocks = [
        {"type": "text", "text": "abcd" * 5},
        "abcd",
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 10_000}},
    ]
    assert content_tokens(blocks) == 5 + 1 + NON_TEXT_BLOCK_TOKENS
    assert content_tokens([]) == 0


def test_message_tokens_overhead_and_name() -> None:
    messages = [SystemMessage("abcd"), HumanMessage("abcd", name="ann")]
    expected = 2 * MESSAGE_OVERHEAD_TOKENS + 1 + 1 + approximate_tokens("ann")
    assert message_tokens(messages) == expected
    assert message_tokens([]) == 0


def test_message_tokens_counts_tool_call_arguments() -> None:
    plain = AIMessage("")
    calling = AIMessage(
        "",
        tool_calls=[{"name": "search", "args": {"query": "x" * 400}, "id": "c1"}],
    )
    assert message_tokens([calling]) - message_tokens([plain]) >= 100
    result = ToolMessage("y" * 40, tool_call_id="c1")
    assert message_tokens([result]) == MESSAGE_OVERHEAD_TOKENS + 10


def test_message_tokens_counts_invalid_tool_calls() -> None:
    plain = AIMessage("")
    broken = AIMessage(
        "",
        invalid_tool_calls=[{"name": "f", "args": "{" + "z" * 80, "id": "c1", "error": None}],
    )
    assert message_tokens([broken]) - message_tokens([plain]) >= 20


def test_message_tokens_uses_injected_counter() -> None:
    calls: list[str] = []

    def words(text: str) -> int:
        calls.append(text)
        return len(text.split())

    counter: TokenCounter = words
    assert message_tokens([HumanMessage("one two three")], counter) == MESSAGE_OVERHEAD_TOKENS + 3
    assert calls == ["one two three"]
