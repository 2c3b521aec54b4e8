"""The fact-extraction prompt: atomic third-person facts with type, scope, importance,
entities, sensitivity and an optional supersession reference.

Conversation text and stored memories are fenced as untrusted data
(:mod:`harbor_pg.fencing`).
"""

from __future__ import annotations

from collections.abc import Sequence

from harbor_pg.extraction.facts import memory_reference
from harbor_pg.fencing import (
    SECRETS_RULE,
    MessageLike,
    Prompt,
    escape_untrusted,
    render_conversation,
    untrusted_notice,
)
from harbor_pg.records import Memory

__all__ = ["extraction_prompt", "render_memories", "render_memory", "repair_prompt"]


def render_memory(memory: Memory) -> str:
    """``[<first 12 hex chars of content_hash>] <content>``, content escaped."""
    return f"[{memory_reference(memory)}] {escape_untrusted(' '.join(memory.content.split()))}"


def render_memories(memories: Sequence[Memory]) -> str:
    """Render stored memories, one per line, inside a ``<stored_memories>`` element."""
    body = "\n".join(render_memory(memory) for memory in memories)
    return f"<stored_memories>\n{body}\n</stored_memories>" if body else "<stored_memories/>"


def extraction_prompt(
    messages: Sequence[MessageLike],
    existing: Sequence[Memory] = (),
    *,
    project_available: bool = True,
) -> Prompt:
    """Prompt for extracting durable facts from a finished turn.

    ``existing`` are stored memories shown as ``[<hash prefix>] <content>`` so
    the model can skip restatements and name a contradicted memory in
    ``replaces``. With ``project_available=False`` (an owner without a
    project) the model is told not to propose the ``project`` scope; the
    extractor still enforces that through :func:`coerce_scope`.
    """
    scopes = [
        "user: a personal preference or stable trait of the user",
        "project: a decision, convention or fact about the project",
        "session: a detail that only matters inside this conversation",
    ]
    if not project_available:
        scopes[1] = "project: not available here; use session for project details"
    system = "\n\n".join(
        [
            "You extract durable memories from a conversation between a user and an AI "
            "assistant, for recall in later conversations.",
            "Return a list of atomic facts. Each fact is one self-contained statement in the "
            "third person that makes sense without the conversation: 'The user prefers "
            "metric units.', not 'I prefer metric' or 'They prefer it'. Only record what the "
            "user stated or clearly confirmed, or what a tool result established; not the "
            "assistant's guesses, suggestions or questions. Skip small talk, one-off "
            "requests, and anything already present in <stored_memories> unless it changed.",
            "For each fact give:\n"
            "- content: the statement;\n"
            "- type: fact, preference, decision or episode;\n"
            "- scope, the narrowest that fits:\n  - " + "\n  - ".join(scopes) + ";\n"
            "- importance: 0 (trivial) to 1 (essential to remember);\n"
            "- entities: the names of the people, projects, products and tools it is about;\n"
            "- sensitivity: none, low, pii (personal data such as contact details, health, "
            "location) or sensitive (financial, legal, security-relevant, or anything "
            "harmful if leaked);\n"
            "- replaces: when the fact contradicts or updates a stored memory, copy that "
            "memory's bracketed reference exactly, e.g. [3f9a0c1b2d4e]; otherwise null.",
            SECRETS_RULE + " Do not store a fact that contains or describes the value of "
            "such a secret; at most note that one exists, without its value.",
            untrusted_notice("stored_memories", "conversation"),
            'Answer as JSON: {"facts": [...]}; use {"facts": []} when nothing is worth '
            "remembering.",
        ]
    )
    user = "\n\n".join(
        [
            "Stored memories (for deduplication and supersession):",
            render_memories(existing),
            "Conversation to extract from:",
            render_conversation(messages),
            "Extract the facts.",
        ]
    )
    return Prompt(system, user)


def repair_prompt(prompt: Prompt, answer: str, problem: str) -> Prompt:
    """The one second chance an extraction answer gets: ``prompt`` again, with the
    ``answer`` that could not be read (fenced as untrusted) and what was wrong with it."""
    user = "\n\n".join(
        [
            prompt.user,
            "Your previous answer could not be read as the JSON asked for "
            f"({escape_untrusted(problem)}):",
            f"<previous_answer>\n{escape_untrusted(answer)}\n</previous_answer>",
            'Answer again with only the JSON object {"facts": [...]}, nothing else.',
        ]
    )
    return Prompt(prompt.system, user)
