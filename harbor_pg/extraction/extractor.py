"""MemoryExtractor: the durable facts a finished turn stated, stored add-only.

One extraction is one model call and, per stored fact, a few statements:

1. The owner's currently valid memories in the chat scopes (USER, PROJECT,
   SESSION; newest first, bounded) are loaded and shown to the model as
   ``[<hash prefix>] <content>``, so it can skip restatements and name a
   memory a new fact contradicts.
2. The model proposes atomic third-person facts (type, scope, importance,
   entity mentions, sensitivity, optional ``replaces``). Its answer is parsed
   leniently (:mod:`harbor_pg.extraction.facts`); the conversation is fenced
   as untrusted data (:func:`~harbor_pg.extraction.prompts.extraction_prompt`).
3. Deterministic gates, before anything is saved: blank facts and facts
   below ``extraction_min_importance`` are dropped, facts carrying a
   credential are refused (:mod:`harbor_pg.extraction.secrets`), the scope is
   narrowed to what chat may write (:func:`~harbor_pg.extraction.facts.coerce_scope`),
   and a ``replaces`` reference is kept only when it names, exactly, a
   memory that was rendered into this prompt, in the same scope.
4. Entity mentions are anchored to knowledge-graph ids through a
   :class:`~harbor_pg.extraction.entities.MemoryEntityResolver` when one is
   wired -- one ``resolve_entities(mentions, tenant_id=owner.tenant_id)`` call,
   read-only, nothing is written to a graph -- else stored verbatim.
5. With an embedder, the facts are embedded in one batch, and a fact whose
   nearest currently valid memory in the same scope scores at or above
   ``dedup_threshold`` (cosine similarity, computed by the store) is skipped
   as a restatement. The memory a fact replaces is left out of that
   comparison: an update is usually close to what it updates.
6. Each remaining fact becomes a new row valid from now (``source="extracted"``),
   or, with a resolved reference, the successor of the replaced memory,
   which closes the old interval in the same statement. Identical content
   already valid in the scope is a no-op (the database's unique index on
   current rows), which is what makes a retried turn harmless. Steps 5 and 6
   are one transaction per fact (:meth:`~harbor_pg.tiers.base.ExtractionStore.add_fact`).

Failure semantics: every failure (model, embedder, index, repository) is
logged at WARNING and :meth:`MemoryExtractor.extract` returns the memories
already saved, ``()`` when none; it never raises. An entity resolver that
raises only costs the anchors. Log records never carry conversation or fact
content.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage
from pydantic import BaseModel

from harbor_pg.embedders.base import Embedder, EmbedderError
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.extraction.entities import MemoryEntityResolver, anchored_entity_ids, mention_key
from harbor_pg.extraction.facts import (
    CHAT_SCOPES,
    ExtractedFact,
    ExtractionResult,
    memory_reference,
)
from harbor_pg.extraction.prompts import extraction_prompt, repair_prompt
from harbor_pg.extraction.secrets import contains_secret, secret_kind
from harbor_pg.fencing import Prompt
from harbor_pg.llm.base import (
    MemoryModel,
    MemoryModelError,
    StructuredOutputUnsupportedError,
    supports_structured_output,
)
from harbor_pg.llm.langchain import as_memory_model
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType, content_hash
from harbor_pg.telemetry import chat_span
from harbor_pg.tiers.base import ExtractionStore, ShortTermStore

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = [
    "DEFAULT_MAX_FACTS",
    "DEFAULT_RENDER_LIMIT",
    "MemoryExtractor",
    "extract_memories",
    "parse_text_answer",
]

log = logging.getLogger("harbor_pg.extraction")

#: Stored memories shown to the model per extraction (newest first).
DEFAULT_RENDER_LIMIT = 50
#: Facts one extraction stores at most; the rest of an over-long answer is dropped.
DEFAULT_MAX_FACTS = 20
#: most characters of a model's unreadable answer kept (in a MemoryModelError, on the
#: job queue's record of a failed job)
RAW_OUTPUT_CHARS = 4000

MessageLike = ConversationMessage | BaseMessage

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?|\n?\s*```\s*$")


def _has_attribute(obj: object, name: str) -> bool:
    """``hasattr`` without running the object's ``__getattr__`` (a misfit collaborator's)."""
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return False
    return True


def _describe(exc: BaseException) -> str:
    """Exception class and first line of its message (never a traceback or payload)."""
    text = str(exc).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _as_text(answer: object) -> str:
    """A structured answer that failed validation, as text for the repair prompt."""
    try:
        return json.dumps(answer, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(answer)


def parse_text_answer(text: str) -> ExtractionResult:
    """Read an extraction answer given as plain text (a model without structured output).

    Accepts the JSON object the prompt asks for, a bare JSON list of facts,
    either inside a Markdown code fence or surrounded by prose.

    Raises:
        ValueError: no JSON object or list could be read from ``text``.
    """
    body = _FENCE.sub("", text.strip())
    try:
        data: Any = json.loads(body)
    except ValueError:
        starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
        end = max(body.rfind("}"), body.rfind("]"))
        if not starts or end < min(starts):
            raise ValueError("the answer holds no JSON object or list") from None
        data = json.loads(body[min(starts) : end + 1])
    return ExtractionResult.model_validate(data)


def _message_ids(messages: Sequence[MessageLike]) -> list[str]:
    """Ids of the given messages that have one, as text, in order, without duplicates."""
    ids: list[str] = []
    for message in messages:
        raw = getattr(message, "id", None)
        if raw is None or isinstance(raw, bool):
            continue
        value = str(raw)
        if value and value not in ids:
            ids.append(value)
    return ids


@dataclass(frozen=True)
class _Candidate:
    """A proposed fact that passed the deterministic gates."""

    fact: ExtractedFact
    scope: MemoryScope
    content: str
    digest: str
    mentions: list[str]
    replaces: Memory | None


class MemoryExtractor:
    """Extracts durable facts from a finished turn and stores them add-only.

    Args:
        memories: the long-term store (both built-in stores qualify); it also
            serves as the similarity index and performs supersession.
        model: a :class:`~harbor_pg.llm.MemoryModel`, or a LangChain chat
            model (wrapped). Models without structured output answer in text,
            which is parsed as JSON.
        policy: reads ``enabled``, ``extraction_min_importance``,
            ``dedup_threshold``, ``entity_confidence_floor`` and
            ``max_content_chars``. With ``enabled=False`` nothing is extracted
            and no model is called.
        embedder: when set, every stored fact gets its vector (one batched
            ``embed`` call per extraction) and the similarity gate is on.
        entities: a :class:`~harbor_pg.extraction.entities.MemoryEntityResolver`
            (``resolve_entities(mentions, *, tenant_id)``) that maps entity
            mentions to knowledge-graph ids; resolutions below
            ``entity_confidence_floor`` are dropped. Without it the model's
            mentions are stored verbatim.
        render_limit: how many stored memories the model is shown (0 shows
            none, which also turns supersession off).
        max_facts: most facts one extraction stores.

    Raises:
        MemoryConfigurationError: a collaborator does not fit its role.
    """

    def __init__(
        self,
        *,
        memories: ExtractionStore,
        model: MemoryModel | BaseChatModel,
        policy: MemoryPolicy | None = None,
        embedder: Embedder | None = None,
        entities: MemoryEntityResolver | None = None,
        render_limit: int = DEFAULT_RENDER_LIMIT,
        max_facts: int = DEFAULT_MAX_FACTS,
    ) -> None:
        if not isinstance(memories, ExtractionStore):
            raise MemoryConfigurationError(
                "memories must implement ExtractionStore (current_memories, nearest_in_scope, "
                f"supersede, add_fact), got {type(memories).__name__}"
            )
        resolved_model = as_memory_model(model)
        if resolved_model is None:
            raise MemoryConfigurationError("MemoryExtractor needs a model")
        if policy is not None and not isinstance(policy, MemoryPolicy):
            raise MemoryConfigurationError(
                f"policy must be a MemoryPolicy, got {type(policy).__name__}"
            )
        if embedder is not None and not isinstance(embedder, Embedder):
            raise MemoryConfigurationError(
                f"embedder must implement Embedder, got {type(embedder).__name__}"
            )
        if entities is not None and not isinstance(entities, MemoryEntityResolver):
            hint = (
                " (it has resolve(mentions, owner); rename it to "
                "resolve_entities(mentions, *, tenant_id))"
                if _has_attribute(entities, "resolve")
                else ""
            )
            raise MemoryConfigurationError(
                "entities must implement MemoryEntityResolver.resolve_entities(mentions, *, "
                f"tenant_id), got {type(entities).__name__}{hint}"
            )
        for name, value, low in (("render_limit", render_limit, 0), ("max_facts", max_facts, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise MemoryConfigurationError(f"{name} must be an integer >= {low}")
        self.memories = memories
        self.model: MemoryModel = resolved_model
        self.policy = policy or MemoryPolicy()
        self.embedder = embedder
        self.entities = entities
        self.render_limit = render_limit
        self.max_facts = max_facts

    async def extract(
        self, owner: MemoryOwner, messages: Sequence[MessageLike], *, strict: bool = False
    ) -> tuple[Memory, ...]:
        """Extract the facts ``messages`` state and store them for ``owner``.

        ``messages`` is the finished turn (stored :class:`ConversationMessage`
        rows or LangChain messages); their ids become each fact's
        ``source_message_ids`` and ``owner.session_id`` its
        ``source_session_id``. ``owner`` must address a session (tenant,
        principal or user, session); facts are stored under it narrowed to
        each fact's scope.

        Returns:
            The memories this call created, in the model's order; restatements
            and duplicates are not included. ``()`` when nothing was stored.
            Never raises: every failure is logged at WARNING and what was
            saved until then is returned. With ``strict=True`` (a queued job,
            which the queue retries) the failure is logged and raised instead;
            what was saved stays, and a re-run stores none of it twice (the
            content-hash gate).
        """
        saved: list[Memory] = []
        stage = "start"
        try:
            if not self.policy.enabled or not messages:
                return ()
            if not owner.can_address(MemoryScope.SESSION):
                log.warning(
                    "memory extraction skipped: the owner does not address a session "
                    "(tenant, principal or user, and session ids are needed)"
                )
                return ()
            stage = "loading stored memories"
            existing = await self._stored_memories(owner)
            stage = "the model call"
            prompt = extraction_prompt(
                messages, existing, project_available=owner.can_address(MemoryScope.PROJECT)
            )
            result = await self._ask(prompt)
            stage = "checking the proposed facts"
            candidates = self._candidates(owner, result.facts, existing)
            if not candidates:
                return ()
            entity_ids = await self._anchor(owner, candidates)
            stage = "embedding"
            vectors = await self._embed(candidates)
            source_ids = _message_ids(messages)
            for index, candidate in enumerate(candidates):
                stage = f"storing fact {index + 1} of {len(candidates)}"
                vector = vectors[index] if vectors is not None else None
                stored = await self._store(owner, candidate, entity_ids[index], vector, source_ids)
                if stored is not None:
                    saved.append(stored)
        except Exception as exc:  # the one rule: log, and return what was saved
            log.warning(
                "memory extraction stopped during %s (%s); %d memories saved",
                stage,
                _describe(exc),
                len(saved),
            )
            if strict:
                raise
        return tuple(saved)

    # -- stages ---------------------------------------------------------------------

    async def _stored_memories(self, owner: MemoryOwner) -> list[Memory]:
        if self.render_limit == 0:
            return []
        rows = await self.memories.current_memories(owner, CHAT_SCOPES, limit=self.render_limit)
        # a store of one's own may be sloppy: show only rows supersession may act on
        return [
            row
            for row in rows[: self.render_limit]
            if isinstance(row, Memory)
            and row.id is not None
            and row.scope in CHAT_SCOPES
            and row.memory_type is not MemoryType.SUMMARY
            and row.superseded_by is None
            and row.invalid_at is None
        ]

    @chat_span("extract")
    async def _ask(self, prompt: Prompt) -> ExtractionResult:
        """The model's facts. An answer that cannot be read as an
        :class:`ExtractionResult` gets one repair attempt (the prompt again, with
        that answer and what was wrong with it); if that fails too, a
        :class:`MemoryModelError` carrying the last answer, bounded."""
        answer_text: str | None = None
        if supports_structured_output(self.model):
            try:
                answer: object = await self.model.generate_structured(
                    prompt.system, prompt.user, ExtractionResult
                )
            except StructuredOutputUnsupportedError:
                pass
            else:
                if isinstance(answer, ExtractionResult):
                    return answer
                if isinstance(answer, BaseModel):
                    answer = answer.model_dump()
                try:
                    return ExtractionResult.model_validate(answer)
                except ValueError as exc:
                    answer_text, problem = _as_text(answer), _describe(exc)
        if answer_text is None:
            answer_text = await self.model.generate_text(prompt.system, prompt.user)
            try:
                return parse_text_answer(answer_text)
            except ValueError as exc:
                problem = _describe(exc)
        retry = repair_prompt(prompt, answer_text[:RAW_OUTPUT_CHARS], problem)
        repaired = await self.model.generate_text(retry.system, retry.user)
        try:
            return parse_text_answer(repaired)
        except ValueError as exc:
            raise MemoryModelError(
                "the model's answer is not the extraction JSON, after one repair attempt "
                f"({_describe(exc)})",
                raw_output=repaired[:RAW_OUTPUT_CHARS],
            ) from None

    def _candidates(
        self, owner: MemoryOwner, facts: Sequence[ExtractedFact], existing: Sequence[Memory]
    ) -> list[_Candidate]:
        """Apply the deterministic gates; nothing here touches a store or a model."""
        if len(facts) > self.max_facts:
            log.warning(
                "memory extraction: the model proposed %d facts; only the first %d are considered",
                len(facts),
                self.max_facts,
            )
            facts = facts[: self.max_facts]
        references: dict[str, Memory | None] = {}
        for memory in existing:
            ref = memory_reference(memory)
            # two rendered memories sharing a prefix: neither can be named unambiguously
            references[ref] = None if ref in references else memory
        stored_hashes = {m.content_hash for m in existing if m.content_hash}
        seen: set[str] = set()
        replaced: set[str] = set()
        floor = self.policy.extraction_min_importance
        out: list[_Candidate] = []
        for fact in facts:
            content = " ".join(fact.content.split())
            if not content:
                continue
            if fact.importance < floor:
                log.debug("memory extraction: dropped a fact below the importance floor")
                continue
            if len(content) > self.policy.max_content_chars or "\x00" in content:
                log.warning("memory extraction: dropped an over-long or malformed fact")
                continue
            kind = secret_kind(content)
            if kind is not None:
                log.warning("memory extraction: refused a fact carrying a credential (%s)", kind)
                continue
            scope = fact.scope_for(owner)
            digest = content_hash(scope, content)
            if digest in seen or digest in stored_hashes:
                log.debug("memory extraction: skipped already stored fact [%s]", digest[:12])
                continue
            seen.add(digest)
            mentions = [m for m in fact.entities if "\x00" not in m and not contains_secret(m)]
            out.append(
                _Candidate(
                    fact=fact,
                    scope=scope,
                    content=content,
                    digest=digest,
                    mentions=mentions,
                    replaces=self._replaced(fact, scope, references, replaced),
                )
            )
        return out

    @staticmethod
    def _replaced(
        fact: ExtractedFact,
        scope: MemoryScope,
        references: dict[str, Memory | None],
        replaced: set[str],
    ) -> Memory | None:
        """The rendered memory ``fact.replaces`` names, if supersession may act on it."""
        if fact.replaces is None:
            return None
        target = references.get(fact.replaces)
        if target is None or target.id is None:
            log.info("memory extraction: ignored a reference to a memory that was not shown")
            return None
        if target.scope is not scope:
            log.info("memory extraction: ignored a reference to a memory in another scope")
            return None
        if target.id in replaced:
            log.info("memory extraction: ignored a second replacement of one memory")
            return None
        replaced.add(target.id)
        return target

    async def _anchor(
        self, owner: MemoryOwner, candidates: Sequence[_Candidate]
    ) -> list[list[str]]:
        """Entity ids per candidate: resolved ids, or the mentions verbatim without a resolver."""
        if self.entities is None:
            return [list(c.mentions) for c in candidates]
        mentions: dict[str, str] = {}
        for candidate in candidates:
            for mention in candidate.mentions:
                mentions.setdefault(mention_key(mention), mention)
        if not mentions:
            return [[] for _ in candidates]
        try:
            resolutions = await self.entities.resolve_entities(
                list(mentions.values()), tenant_id=owner.tenant_id
            )
            return anchored_entity_ids(
                [c.mentions for c in candidates],
                resolutions,
                self.policy.entity_confidence_floor,
            )
        except Exception as exc:  # seed 000: a failing resolver costs the anchors only
            log.warning(
                "memory extraction: the entity resolver failed (%s); facts are stored "
                "without entity ids",
                _describe(exc),
            )
            return [[] for _ in candidates]

    async def _embed(self, candidates: Sequence[_Candidate]) -> list[list[float]] | None:
        if self.embedder is None:
            return None
        vectors = await self.embedder.embed([c.content for c in candidates])
        if len(vectors) != len(candidates):
            raise EmbedderError(
                f"{self.embedder.model_id} returned {len(vectors)} vectors for "
                f"{len(candidates)} texts"
            )
        return [list(v) for v in vectors]

    async def _store(
        self,
        owner: MemoryOwner,
        candidate: _Candidate,
        entity_ids: list[str],
        vector: list[float] | None,
        source_ids: list[str],
    ) -> Memory | None:
        """The similarity gate, then a supersession or an insert; the new memory, or None."""
        model_id = self.embedder.model_id if self.embedder is not None else None
        replaces = candidate.replaces
        fact = candidate.fact
        memory = Memory(
            scope=candidate.scope,
            memory_type=fact.type,
            content=candidate.content,
            content_hash=candidate.digest,
            importance=fact.importance,
            entity_ids=entity_ids,
            source="extracted",
            sensitivity=fact.sensitivity,
            source_session_id=owner.session_id,
            source_message_ids=source_ids,
        )
        result = await self.memories.add_fact(
            owner,
            memory,
            embedding=vector,
            model_id=model_id if vector is not None else None,
            dedup_threshold=self.policy.dedup_threshold if vector is not None else None,
            replaces=replaces.id if replaces is not None else None,
        )
        if result.restatement_of is not None:
            log.debug(
                "memory extraction: skipped a restatement (similarity %.3f)",
                result.restatement_of.similarity,
            )
        elif replaces is not None and result.created and result.superseded is None:
            log.info(
                "memory extraction: the replaced memory is no longer current; "
                "the fact is stored without superseding it"
            )
        return result.memory if result.created else None


async def extract_memories(
    owner: MemoryOwner,
    *,
    short_term: ShortTermStore,
    extractor: MemoryExtractor | None,
    extract_facts: bool = False,
    limit: int | None = None,
) -> list[str]:
    """Mine a session's recent turns for durable facts; return the new memory ids.

    Seed 004's convenience over :meth:`MemoryExtractor.extract`: reads the
    newest ``limit`` turns (default: the extractor policy's
    ``recent_max_messages``) of ``owner``'s session from ``short_term`` and
    extracts from them. Facts stored by an earlier call are not stored again
    (the content-hash and similarity gates), so calling it after every turn is
    safe.

    It is off by default because it costs one model call per call: pass
    ``extract_facts=True`` to turn it on.

    Raises:
        MemoryConfigurationError: ``extract_facts`` is false, or no extractor
            was given. Every other failure (reading the turns, the model, the
            stores) is logged at WARNING and yields the ids stored so far.
    """
    if not extract_facts:
        raise MemoryConfigurationError(
            "fact extraction is off: pass extract_facts=True (it costs one model call per call)"
        )
    if extractor is None:
        raise MemoryConfigurationError("fact extraction needs a MemoryExtractor")
    count = extractor.policy.recent_max_messages if limit is None else limit
    if count <= 0:
        return []
    try:
        turns = await short_term.recent(owner, count)
    except Exception as exc:  # same failure rule as extract()
        log.warning(
            "memory extraction: could not read the session's turns (%s); nothing extracted",
            _describe(exc),
        )
        return []
    stored = await extractor.extract(owner, turns)
    return [m.id for m in stored if m.id is not None]
