"""The no-model path: an extractive conversation summary.

When no language model is configured (the default, so nothing leaves the
machine), the rolling summary is built from the conversation's own sentences:
the most informative user and assistant sentences that fit a budget, biased
towards the newest, written as ``Role: text`` lines in conversation order.
The no-model path does no query rewrite: the question is searched as asked.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.tokens import approximate_tokens

__all__ = ["ExtractiveSummarizer"]

_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
_ROLE_LINE = re.compile(r"^(User|Assistant|System|Tool):\s*(.*)$")
_LANGCHAIN_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
_LABELS = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool"}

# Words that carry no memory on their own: function words and chat filler.
_STOPWORD_TEXT = """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just let me more most my myself no nor not now of off on once only or other our
    ours ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    i'm i've i'd i'll you're you've it's that's don't doesn't didn't can't won't isn't aren't
    ok okay oh hi hello hey thanks thank yes yeah yep sure great cool nice good fine please sorry
    well really also maybe lol haha wow right got get gets let's one thing things something
    anything else would could should might must shall help assist welcome"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())

# What a reader of the next turn needs from older history: what was decided, what
# someone prefers, who owns or does what, and what is still open. A sentence that
# states one of these outranks one that only carries rare words (a pasted log line
# is full of rare numbers and says none of them).
_DECISION = re.compile(
    r"\b(?:we|i|they|team) (?:have |had |'ve )?(?:decided|agreed|chose|picked|settled on)\b|"
    r"\bdecisions?:|\b(?:we|i)(?:'ll| will| shall) (?:use|keep|move|switch|go with|stick with)\b|"
    r"\b(?:we|i) keep\b|\bgoing with\b|\bthe plan is\b|\bapproved\b",
    re.IGNORECASE,
)
_PREFERENCE = re.compile(
    r"\b(?:i|we) (?:prefer|like|love|hate|dislike|want|need|read|always|never)\b|"
    r"\bprefer(?:s|red|ence)?\b|\bplease (?:keep|use|don't|do not|avoid|always|never|make)\b|"
    r"\bi'd (?:rather|like)\b|\bi would rather\b|\b(?:don't|do not) like\b|"
    r"\bfavou?rite\b|\b(?:answers?|replies|it) (?:is|are) fine\b",
    re.IGNORECASE,
)
_OWNERSHIP = re.compile(
    r"\b(?:owns|owner|owned by|ownership|look(?:s)? after|looking after|responsible for|"
    r"in charge of|maintains|maintainer|assigned to|takes? care of|reviews|reviewer)\b|"
    r"\b(?:i|we|he|she|they)(?:'ll| will)? (?:write|fix|add|handle|take|own|review)s?\b|"
    r"\b[A-Z][a-z]+ (?:writes|fixes|adds|handles|owns|reviews|takes)\b",
)
_OPEN = re.compile(
    r"\b(?:open question|still (?:need|have) to|not (?:yet )?decided|undecided|"
    r"to be decided|tbd|unclear|not sure|haven't decided|need to (?:decide|figure out|find out)|"
    r"no owner|nobody owns|unresolved)\b",
    re.IGNORECASE,
)
#: weight of each kind of statement
_SALIENCE = ((_DECISION, 3.0), (_OWNERSHIP, 3.0), (_PREFERENCE, 2.5), (_OPEN, 2.0))


def _role_and_text(message: object) -> tuple[str | None, str]:
    """Read (role, text) from a harbor-pg/pydantic message, a mapping or a LangChain message."""
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    else:
        role = getattr(message, "role", None)
        if role is None:
            role = _LANGCHAIN_ROLES.get(str(getattr(message, "type", "")))
        content = getattr(message, "content", None)
    if isinstance(content, list):
        content = " ".join(
            str(block.get("text", "")) if isinstance(block, Mapping) else str(block)
            for block in content
            if isinstance(block, str) or (isinstance(block, Mapping) and "text" in block)
        )
    return (str(role) if role is not None else None), (content if isinstance(content, str) else "")


@dataclass
class _Sentence:
    unit: int  # which message (or prior-summary line) it came from; also its age order
    order: int  # position inside the unit
    text: str
    words: frozenset[str]
    has_number: bool
    has_name: bool
    #: share of its tokens that are numbers (a log line or a table row is mostly numbers)
    numeric: float = 0.0
    #: how much of what the next turn needs it states (decision, preference, owner, open)
    salience: float = 1.0
    score: float = 0.0


@dataclass
class _Unit:
    role: str | None
    sentences: list[_Sentence] = field(default_factory=list)


class ExtractiveSummarizer:
    """Deterministic extractive summary of a conversation under a budget.

    Each user and assistant sentence is scored by what a reader of the next turn
    needs from it: sentences stating a decision, a preference, who owns or does
    what, or an open question weigh two to three times more; within that, by how
    much rare, content-bearing vocabulary it carries (inverse document frequency
    over the conversation's sentences; numbers count for less than words, and a
    sentence made mostly of numbers, such as a pasted log line, for much less; a
    small bonus for names; the user's questions count more, the assistant's
    clarifying questions less), multiplied by a recency factor that rises linearly from 1 for
    the oldest message to ``1 + recency_weight`` for the newest. Sentences are
    taken best-first, skipping near-duplicates of ones already taken, while the
    rendered summary stays within budget; the result lists them in conversation
    order as ``User: ...`` / ``Assistant: ...`` lines. The same input always
    gives the same output, and no data leaves the process.

    Args:
        max_chars: character budget of the summary (default 1200).
        max_tokens: token budget instead, counted with ``token_counter``; give at
            most one of ``max_chars`` and ``max_tokens``.
        recency_weight: how much the newest message outweighs the oldest (0 = none).
        max_sentence_chars: longer sentences are cut at a word boundary.
        roles: the message roles summarised; system and tool messages are skipped
            by default.
        token_counter: counts a text's tokens for ``max_tokens`` budgets (default:
            four ASCII characters a token, non-ASCII characters one each).

    Raises:
        MemoryConfigurationError: a non-positive budget or negative weight.
    """

    def __init__(
        self,
        *,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        recency_weight: float = 1.0,
        max_sentence_chars: int = 300,
        roles: Sequence[str] = ("user", "assistant"),
        token_counter: Callable[[str], int] | None = None,
    ) -> None:
        if max_chars is not None and max_tokens is not None:
            raise MemoryConfigurationError("give max_chars or max_tokens, not both")
        if max_chars is None and max_tokens is None:
            max_chars = 1200
        for name, value in (("max_chars", max_chars), ("max_tokens", max_tokens)):
            if value is not None and value <= 0:
                raise MemoryConfigurationError(f"{name} must be positive, got {value!r}")
        if recency_weight < 0:
            raise MemoryConfigurationError(f"recency_weight must be >= 0, got {recency_weight!r}")
        if max_sentence_chars < 20:
            raise MemoryConfigurationError(
                f"max_sentence_chars must be >= 20, got {max_sentence_chars!r}"
            )
        self.max_chars = max_chars
        self.max_tokens = max_tokens
        self.recency_weight = recency_weight
        self.max_sentence_chars = max_sentence_chars
        self.roles = frozenset(roles)
        self.token_counter: Callable[[str], int] = token_counter or approximate_tokens

    def __repr__(self) -> str:
        budget = (
            f"max_tokens={self.max_tokens}"
            if self.max_tokens is not None
            else f"max_chars={self.max_chars}"
        )
        return f"ExtractiveSummarizer({budget}, recency_weight={self.recency_weight})"

    # asummarize() below repeats this signature on purpose: its async twin.
    def summarize(
        self,
        messages: Sequence[object],
        *,
        prior_summary: str | None = None,
        max_chars: int | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """Summarise ``messages`` (oldest first), folding in ``prior_summary``.

        ``messages`` may be harbor-pg ``ConversationMessage`` rows, any object
        with ``role`` and ``content``, ``{"role": ..., "content": ...}`` mappings
        or LangChain messages. Lines of ``prior_summary`` compete with the new
        sentences as if older than all of them. A per-call ``max_chars`` or
        ``max_tokens`` overrides the configured budget. Returns ``""`` when
        nothing informative fits.
        """
        if max_chars is not None and max_tokens is not None:
            raise MemoryConfigurationError("give max_chars or max_tokens, not both")
        if max_chars is None and max_tokens is None:
            max_chars, max_tokens = self.max_chars, self.max_tokens
        budget = max_tokens if max_tokens is not None else max_chars
        assert budget is not None
        if budget <= 0:
            return ""
        measure = self.token_counter if max_tokens is not None else len

        units = self._units(messages, prior_summary)
        sentences = [s for unit in units for s in unit.sentences]
        self._score(sentences, len(units))
        ranked = sorted(
            (s for s in sentences if s.score > 0),
            key=lambda s: (-s.score, -s.unit, s.order),
        )
        # Adding a sentence lengthens the rendering by at least the sentence and a
        # separator, so under the built-in measures it adds at least its own measure
        # minus one (token estimates round up): a sentence past that bound cannot fit
        # and is skipped without rendering (rendering each trial made this quadratic).
        bounded = measure is len or measure is approximate_tokens
        chosen: list[_Sentence] = []
        used = 0
        # the built-in measures are exact from the rendering's ASCII and other character
        # counts, which grow by a known amount per sentence: no trial rendering needed
        ascii_chars = other_chars = 0
        lines: set[int] = set()
        for candidate in ranked:
            if bounded and measure(candidate.text) - 1 > budget - used:
                continue
            if any(_overlap(candidate.words, kept.words) >= 0.6 for kept in chosen):
                continue
            if bounded:
                text_ascii = len(candidate.text.encode("ascii", "ignore"))
                extra = text_ascii + 1 if candidate.unit in lines else text_ascii
                if candidate.unit not in lines:
                    extra += len(_prefix(units[candidate.unit].role)) + (1 if lines else 0)
                grown_ascii = ascii_chars + extra
                grown_other = other_chars + len(candidate.text) - text_ascii
                if measure is len:
                    size = grown_ascii + grown_other
                else:
                    size = max(1, math.ceil(grown_ascii / 4) + grown_other)
                if size <= budget:
                    chosen.append(candidate)
                    used, ascii_chars, other_chars = size, grown_ascii, grown_other
                    lines.add(candidate.unit)
                continue
            trial = [*chosen, candidate]
            size = measure(_render(units, trial))
            if size <= budget:
                chosen, used = trial, size
        return _render(units, chosen)

    async def asummarize(
        self,
        messages: Sequence[object],
        *,
        prior_summary: str | None = None,
        max_chars: int | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """Async twin of :meth:`summarize`: the CPU work runs in a worker thread, so a
        summary written in the background never holds up the application's event loop."""
        return await asyncio.to_thread(
            self.summarize,
            list(messages),
            prior_summary=prior_summary,
            max_chars=max_chars,
            max_tokens=max_tokens,
        )

    def _units(self, messages: Sequence[object], prior_summary: str | None) -> list[_Unit]:
        units: list[_Unit] = []
        if prior_summary:
            for line in prior_summary.splitlines():
                line = line.strip()
                if not line:
                    continue
                match = _ROLE_LINE.match(line)
                role = match.group(1).lower() if match else None
                self._add_unit(units, role, match.group(2) if match else line)
        for message in messages:
            role, text = _role_and_text(message)
            if role in self.roles and text.strip():
                self._add_unit(units, role, text)
        return units

    def _add_unit(self, units: list[_Unit], role: str | None, text: str) -> None:
        unit = _Unit(role)
        index = len(units)
        pieces = (p.strip() for line in text.splitlines() for p in _SENTENCE_END.split(line))
        for order, piece in enumerate(p for p in pieces if p):
            piece = self._shorten(" ".join(piece.split()))
            tokens = _WORD.findall(piece)
            words = frozenset(
                w
                for w in (t.casefold() for t in tokens)
                if w not in _STOPWORDS and (len(w) > 1 or w.isdigit())
            )
            unit.sentences.append(
                _Sentence(
                    unit=index,
                    order=order,
                    text=piece,
                    words=words,
                    has_number=any(t.isdigit() or t[0].isdigit() for t in tokens),
                    # a capitalised word that does not start the sentence: likely a name
                    has_name=any(
                        t[0].isupper() and t.casefold() not in _STOPWORDS for t in tokens[1:]
                    ),
                    numeric=sum(t[0].isdigit() for t in tokens) / max(len(tokens), 1),
                    salience=_salience(piece, role),
                )
            )
        units.append(unit)

    def _shorten(self, text: str) -> str:
        if len(text) <= self.max_sentence_chars:
            return text
        cut = text[: self.max_sentence_chars - 1]
        space = cut.rfind(" ")
        if space > self.max_sentence_chars // 2:
            cut = cut[:space]
        return cut.rstrip(" ,;:") + "…"

    def _score(self, sentences: list[_Sentence], unit_count: int) -> None:
        document_frequency: dict[str, int] = {}
        for sentence in sentences:
            for word in sentence.words:
                document_frequency[word] = document_frequency.get(word, 0) + 1
        total = max(len(sentences), 1)
        newest = max(unit_count - 1, 1)
        for sentence in sentences:
            if not sentence.words:
                sentence.score = 0.0
                continue
            # a number is rare in any conversation: count it for less than a word
            information = sum(
                math.log(1.0 + total / document_frequency[w]) * (0.3 if w[0].isdigit() else 1.0)
                for w in sentence.words
            )
            # favour dense sentences over long ones carrying the same vocabulary
            information /= math.sqrt(max(len(sentence.text) / 80.0, 1.0))
            if sentence.has_number and sentence.numeric < 0.15:
                information *= 1.1  # a figure inside a statement, not a table of them
            if sentence.numeric >= 0.25:
                information *= 0.4  # mostly numbers: a pasted report or log line
            if sentence.has_name:
                information *= 1.1
            recency = 1.0 + self.recency_weight * (sentence.unit / newest)
            sentence.score = information * recency * sentence.salience


def _salience(text: str, role: str | None) -> float:
    """How much of what the next turn needs ``text`` states; 1.0 for none of it.

    The cues count in full for what the user (or an earlier summary) says; the
    assistant's sentences are mostly advice, so only a decision it states counts
    there, and less.
    """
    weight = 1.0
    if role == "assistant":
        if _DECISION.search(text):
            weight = 1.5
        return weight * (0.7 if text.endswith("?") else 0.8)
    for pattern, factor in _SALIENCE:
        if pattern.search(text):
            weight = max(weight, factor)
    if text.endswith("?"):
        weight *= 1.5  # the user's questions are what the conversation is about
    return weight


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def _prefix(role: str | None) -> str:
    """What a summary line starts with for ``role`` (``"User: "``; nothing without a role)."""
    return f"{_LABELS.get(role, role.capitalize())}: " if role else ""


def _render(units: list[_Unit], chosen: list[_Sentence]) -> str:
    by_unit: dict[int, list[_Sentence]] = {}
    for sentence in chosen:
        by_unit.setdefault(sentence.unit, []).append(sentence)
    lines: list[str] = []
    for index in sorted(by_unit):
        text = " ".join(s.text for s in sorted(by_unit[index], key=lambda s: s.order))
        lines.append(_prefix(units[index].role) + text)
    return "\n".join(lines)
