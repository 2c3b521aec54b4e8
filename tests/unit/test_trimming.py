"""Window trimming, the summary boundary, and the ConversationMessage converters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from harbor_pg.context.trimming import (
    from_langchain,
    summary_boundary,
    to_langchain,
    trim_window,
)
from harbor_pg.errors import MemoryValidationError
from harbor_pg.messages import HARBOR_KWARGS_KEY, is_user_message, message_text
from harbor_pg.records import ConversationMessage
from harbor_pg.tokens import message_tokens


def one_token_per_char(text: str) -> int:
    return len(text)


def call(call_id: str, name: str = "search") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": {"q": call_id}, "id": call_id}])


def result(call_id: str, text: str = "result") -> ToolMessage:
    return ToolMessage(text, tool_call_id=call_id)


def conversation() -> list[BaseMessage]:
    return [
        HumanMessage("first question"),  # 0
        AIMessage("first answer"),  # 1
        HumanMessage("second question"),  # 2
        call("c1"),  # 3
        result("c1"),  # 4
        AIMessage("second answer"),  # 5
        HumanMessage("third question"),  # 6
        AIMessage("third answer"),  # 7
    ]


def assert_no_orphan_tool_results(window: list[BaseMessage]) -> None:
    issued: set[str] = set()
    for message in window:
        if isinstance(message, AIMessage):
            issued.update(c["id"] for c in message.tool_calls if c["id"])
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in issued, "tool result separated from its call"


# --- trim_window ----------------------------------------------------------------


def test_everything_fits() -> None:
    messages = conversation()
    assert trim_window(messages, 10_000) == messages


def test_empty_window() -> None:
    assert trim_window([], 100) == []


def test_trim_keeps_newest_and_starts_on_human() -> None:
    messages = conversation()
    budget = message_tokens(messages[6:])
    window = trim_window(messages, budget)
    assert window == messages[6:]
    assert isinstance(window[0], HumanMessage)


def test_trim_never_opens_on_a_tool_result() -> None:
    messages = conversation()
    for budget in range(0, message_tokens(messages) + 1):
        window = trim_window(messages, budget)
        assert window, budget
        assert window[-1] is messages[-1]
        assert_no_orphan_tool_results(window)
        if len(window) > 1:
            assert isinstance(window[0], HumanMessage), budget


def test_budget_that_fits_tail_but_not_its_question_drops_to_the_newer_question() -> None:
    messages = conversation()
    # room for messages 3..7 but not for the question at 2: the window starts at 6
    budget = message_tokens(messages[3:])
    assert trim_window(messages, budget) == messages[6:]


def test_budget_too_small_keeps_newest_message() -> None:
    messages = conversation()
    assert trim_window(messages, 0) == [messages[-1]]
    assert trim_window(messages, 1) == [messages[-1]]
    assert trim_window(messages, -5) == [messages[-1]]


def test_single_huge_message_is_kept() -> None:
    huge = HumanMessage("x" * 100_000)
    assert trim_window([huge], 10) == [huge]


def test_newest_tool_result_comes_with_its_call() -> None:
    messages: list[BaseMessage] = [
        HumanMessage("question"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "a", "args": {}, "id": "c1"},
                {"name": "b", "args": {}, "id": "c2"},
            ],
        ),
        result("c1", "x" * 500),
        result("c2", "y" * 500),
    ]
    window = trim_window(messages, 5)
    assert window == messages[1:]
    assert_no_orphan_tool_results(window)


def test_orphan_tool_result_without_call_is_kept_alone() -> None:
    messages: list[BaseMessage] = [HumanMessage("q"), AIMessage("a"), result("zz", "x" * 400)]
    assert trim_window(messages, 3) == [messages[-1]]


def test_one_long_user_turn_with_small_budget_keeps_newest() -> None:
    messages: list[BaseMessage] = [HumanMessage("do the research")]
    for index in range(10):
        messages += [call(f"c{index}"), result(f"c{index}", "r" * 200)]
    messages.append(AIMessage("done"))
    window = trim_window(messages, 100)
    # the only human turn does not fit with its chain, so the newest message stands alone
    assert window == [messages[-1]]


def test_injected_token_counter_is_used() -> None:
    messages: list[BaseMessage] = [HumanMessage("aaaa"), AIMessage("bbbb"), HumanMessage("cc")]
    # per char: each message costs 4 overhead + its length
    assert trim_window(messages, 6, one_token_per_char) == [messages[2]]
    assert trim_window(messages, 22, one_token_per_char) == messages


def test_trim_does_not_mutate_input() -> None:
    messages = conversation()
    before = list(messages)
    trim_window(messages, 20)
    assert messages == before


def test_leading_system_message_is_not_replayed_before_the_first_human() -> None:
    messages: list[BaseMessage] = [SystemMessage("be terse"), HumanMessage("hi"), AIMessage("yo")]
    # the window is history to replay; the application supplies its own system prompt
    assert trim_window(messages, 10_000) == messages[1:]


# --- summary_boundary -----------------------------------------------------------


def test_boundary_keep_covers_everything() -> None:
    messages = conversation()
    assert summary_boundary(messages, 8) == 0
    assert summary_boundary(messages, 100) == 0
    assert summary_boundary([], 3) == 0


def test_boundary_on_a_user_turn_is_exact() -> None:
    messages = conversation()
    assert summary_boundary(messages, 2) == 6


def test_boundary_walks_back_to_the_nearest_user_turn() -> None:
    messages = conversation()
    # keeping 4 would start at the tool result (index 4): walk back to the question at 2
    assert summary_boundary(messages, 4) == 2
    assert summary_boundary(messages, 3) == 2
    assert summary_boundary(messages, 5) == 2
    # keeping 1 would start at an assistant answer: walk back to its question
    assert summary_boundary(messages, 1) == 6


def test_boundary_never_separates_tool_pairs() -> None:
    messages = conversation()
    for keep in range(len(messages) + 1):
        boundary = summary_boundary(messages, keep)
        assert len(messages) - boundary >= keep or boundary == len(messages) - keep
        assert_no_orphan_tool_results(messages[boundary:])
        assert boundary == 0 or boundary == len(messages) or is_user_message(messages[boundary])


def test_boundary_keep_zero_summarises_everything() -> None:
    messages = conversation()
    assert summary_boundary(messages, 0) == len(messages)


def test_boundary_is_zero_for_one_long_user_turn() -> None:
    messages: list[BaseMessage] = [HumanMessage("investigate the outage")]
    for index in range(8):
        messages += [call(f"c{index}"), result(f"c{index}")]
    messages.append(AIMessage("root cause found"))
    assert summary_boundary(messages, 8) == 0


def test_boundary_zero_when_window_opens_mid_chain() -> None:
    messages: list[BaseMessage] = [result("c0"), call("c1"), result("c1"), AIMessage("done")]
    assert summary_boundary(messages, 2) == 0


def test_boundary_recognises_chat_message_user_role() -> None:
    messages: list[BaseMessage] = [
        HumanMessage("a"),
        AIMessage("b"),
        ChatMessage(content="c", role="user"),
        AIMessage("d"),
    ]
    assert summary_boundary(messages, 1) == 2


def test_boundary_rejects_negative_keep() -> None:
    with pytest.raises(MemoryValidationError):
        summary_boundary(conversation(), -1)


# --- converters -----------------------------------------------------------------

WHEN = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)

ROUND_TRIP_CASES: list[ConversationMessage] = [
    ConversationMessage(role="system", content="You are helpful."),
    ConversationMessage(role="user", content="hi", name="ann", id=7, created_at=WHEN),
    ConversationMessage(role="user", content="", metadata={"lang": "en", "n": [1, 2]}),
    ConversationMessage(role="assistant", content="hello"),
    ConversationMessage(
        role="assistant",
        content="",
        tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "c1", "type": "tool_call"}],
        id=8,
        created_at=WHEN.astimezone(timezone(timedelta(hours=-5))),
    ),
    # LangChain shape without "type": LangChain would add it, the stored shape must survive
    ConversationMessage(
        role="assistant",
        content="",
        tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "c1"}],
    ),
    # OpenAI wire shape
    ConversationMessage(
        role="assistant",
        content="calling",
        tool_calls=[
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"id": 3}'},
            }
        ],
    ),
    # unparseable arguments survive too
    ConversationMessage(
        role="assistant",
        content="",
        tool_calls=[{"name": "f", "args": "{not json", "id": "c9"}],
    ),
    ConversationMessage(role="tool", content="42 results", tool_call_id="c1", name="search"),
    ConversationMessage(role="tool", content="orphan"),
    ConversationMessage(role="user", content="odd", tool_call_id="c1", tool_calls=[{"x": 1}]),
    ConversationMessage(role="user", content="naive time", created_at=datetime(2026, 1, 1, 8)),
    ConversationMessage(role="user", content="unicode ✓ 日本", metadata={"nested": {"a": None}}),
]


@pytest.mark.parametrize("message", ROUND_TRIP_CASES)
def test_round_trip_is_exact(message: ConversationMessage) -> None:
    assert from_langchain(to_langchain(message)) == message


def test_to_langchain_classes() -> None:
    assert isinstance(to_langchain(ConversationMessage(role="system", content="s")), SystemMessage)
    assert isinstance(to_langchain(ConversationMessage(role="user", content="u")), HumanMessage)
    assert isinstance(to_langchain(ConversationMessage(role="assistant", content="a")), AIMessage)
    tool = to_langchain(ConversationMessage(role="tool", content="t", tool_call_id="c1"))
    assert isinstance(tool, ToolMessage)
    assert tool.tool_call_id == "c1"


def test_to_langchain_exposes_usable_tool_calls() -> None:
    openai_shape = ROUND_TRIP_CASES[6]
    message = to_langchain(openai_shape)
    assert isinstance(message, AIMessage)
    assert message.tool_calls == [
        {"name": "lookup", "args": {"id": 3}, "id": "call_1", "type": "tool_call"}
    ]
    broken = to_langchain(ROUND_TRIP_CASES[7])
    assert isinstance(broken, AIMessage)
    assert broken.tool_calls == []
    assert broken.invalid_tool_calls[0]["args"] == "{not json"


def test_plain_messages_carry_no_harbor_kwargs() -> None:
    message = to_langchain(ConversationMessage(role="user", content="hi"))
    assert HARBOR_KWARGS_KEY not in message.additional_kwargs
    assert message.id is None
    canonical = ConversationMessage(
        role="assistant",
        content="",
        tool_calls=[{"name": "s", "args": {}, "id": "c1", "type": "tool_call"}],
    )
    assert HARBOR_KWARGS_KEY not in to_langchain(canonical).additional_kwargs


def test_row_id_travels_as_message_id() -> None:
    message = to_langchain(ConversationMessage(role="user", content="hi", id=42))
    assert message.id == "42"


def test_edited_tool_calls_win_over_the_stash() -> None:
    original = ROUND_TRIP_CASES[6]
    message = to_langchain(original)
    assert isinstance(message, AIMessage)
    edited = message.model_copy(
        update={"tool_calls": [{"name": "other", "args": {}, "id": "c2", "type": "tool_call"}]}
    )
    assert from_langchain(edited).tool_calls == [
        {"name": "other", "args": {}, "id": "c2", "type": "tool_call"}
    ]


@pytest.mark.parametrize(
    ("message", "role"),
    [
        (HumanMessage("x"), "user"),
        (AIMessage("x"), "assistant"),
        (SystemMessage("x"), "system"),
        (ToolMessage("x", tool_call_id="c"), "tool"),
        (FunctionMessage(content="x", name="fn"), "tool"),
        (ChatMessage(content="x", role="human"), "user"),
        (ChatMessage(content="x", role="AI"), "assistant"),
        (ChatMessage(content="x", role="developer"), "system"),
    ],
)
def test_from_langchain_roles(message: BaseMessage, role: str) -> None:
    assert from_langchain(message).role == role


@pytest.mark.parametrize(
    "message",
    [ChatMessage(content="x", role="narrator"), RemoveMessage(id="1")],
)
def test_from_langchain_rejects_unknown_roles(message: BaseMessage) -> None:
    with pytest.raises(MemoryValidationError):
        from_langchain(message)


def test_from_langchain_foreign_message() -> None:
    content: list[Any] = [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        "this",
    ]
    message = HumanMessage(content=content, id="run-abc", name="bob")
    converted = from_langchain(message)
    assert converted.content == "look at this"
    assert converted.id is None
    assert converted.name == "bob"
    assert converted.metadata == {}


def test_from_langchain_ignores_malformed_stash() -> None:
    message = HumanMessage(
        "hi", additional_kwargs={HARBOR_KWARGS_KEY: {"created_at": "not a date", "metadata": 3}}
    )
    converted = from_langchain(message)
    assert converted.created_at is None
    assert converted.metadata == {}


def test_converted_metadata_is_a_copy() -> None:
    stored = ConversationMessage(role="user", content="hi", metadata={"tags": ["a"]})
    message = to_langchain(stored)
    message.additional_kwargs[HARBOR_KWARGS_KEY]["metadata"]["tags"].append("b")
    assert stored.metadata == {"tags": ["a"]}


def test_message_text() -> None:
    assert message_text("plain") == "plain"
    assert message_text([{"type": "text", "text": "a"}, {"type": "image"}, "b"]) == "ab"


def test_trimming_round_trips_stored_history() -> None:
    stored = [
        ConversationMessage(role="user", content="q", id=1),
        ConversationMessage(
            role="assistant",
            content="",
            tool_calls=[{"name": "s", "args": {}, "id": "c1", "type": "tool_call"}],
            id=2,
        ),
        ConversationMessage(role="tool", content="r", tool_call_id="c1", id=3),
        ConversationMessage(role="assistant", content="a", id=4),
    ]
    window = trim_window([to_langchain(m) for m in stored], 10_000)
    assert [from_langchain(m) for m in window] == stored
