"""Entity anchoring: the port to a knowledge graph, and how its answers are kept.

Memory is linked to a knowledge graph by id, never written into it. The
:class:`MemoryEntityResolver` port only *reads* the graph: it maps the entity
mentions the extraction model proposed to node ids. Nothing in harbor-pg
creates, merges or changes a graph node.

A resolver's answer is untrusted input like any other: :func:`anchored_entity_ids`
keeps only resolutions of mentions that were asked for, with a well-formed id
and a finite confidence at or above the policy's ``entity_confidence_floor``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from harbor_pg.owner import MAX_ID_LENGTH

__all__ = [
    "MAX_ENTITY_IDS",
    "MemoryEntityResolver",
    "ResolvedEntity",
    "anchored_entity_ids",
    "mention_key",
]

#: Most entity ids stored on one memory.
MAX_ENTITY_IDS = 32


@dataclass(frozen=True, slots=True)
class ResolvedEntity:
    """One mention resolved to a knowledge-graph node.

    Attributes:
        mention: the surface form the model proposed, as it was passed to the resolver.
        entity_id: the knowledge-graph node id it resolved to.
        confidence: how sure the resolver is, 0..1.
    """

    mention: str
    entity_id: str
    confidence: float


@runtime_checkable
class MemoryEntityResolver(Protocol):
    """Resolves entity mentions to knowledge-graph node ids (read-only).

    The port of seed 000 ("Entity anchoring"), exactly::

        async def resolve_entities(
            self, mentions: Sequence[str], *, tenant_id: str
        ) -> tuple[ResolvedEntity, ...]: ...

    The extractor calls it once per extraction, as
    ``resolve_entities(mentions, tenant_id=owner.tenant_id)``, with the
    distinct, non-blank mentions of every fact about to be stored. Resolve
    within that tenant only. Return any number of resolutions per mention
    (none for a mention the graph does not know); order does not matter.
    An exception is logged at WARNING by the extractor, and the facts are then
    stored with no entity ids at all.

    Only this method is recognised: an object offering just the pre-release
    ``resolve(mentions, owner)`` method is rejected when the extractor is
    built (:class:`~harbor_pg.errors.MemoryConfigurationError`, naming the
    method to rename) rather than silently adapted.
    """

    async def resolve_entities(
        self, mentions: Sequence[str], *, tenant_id: str
    ) -> tuple[ResolvedEntity, ...]:
        """Resolve ``mentions`` (distinct, non-blank) to node ids in ``tenant_id``."""
        ...


def mention_key(mention: str) -> str:
    """The form mentions are matched in: whitespace collapsed, case folded."""
    return " ".join(mention.split()).casefold()


def _usable(resolution: object, floor: float) -> tuple[str, str] | None:
    """(mention key, entity id) of a resolution worth keeping, else None."""
    if not isinstance(resolution, ResolvedEntity):
        return None
    mention, entity_id, confidence = (
        resolution.mention,
        resolution.entity_id,
        resolution.confidence,
    )
    if not isinstance(mention, str) or not isinstance(entity_id, str):
        return None
    if isinstance(confidence, bool) or not isinstance(confidence, int | float):
        return None
    if not math.isfinite(confidence) or confidence < floor:
        return None
    entity_id = entity_id.strip()
    if not entity_id or len(entity_id) > MAX_ID_LENGTH or "\x00" in entity_id:
        return None
    return mention_key(mention), entity_id


def anchored_entity_ids(
    mentions_per_fact: Sequence[Sequence[str]],
    resolutions: Iterable[object],
    floor: float,
) -> list[list[str]]:
    """The entity ids to store on each fact, from a resolver's answer.

    A resolution counts only when its mention is one the fact proposed
    (matched with :func:`mention_key`), its ``entity_id`` is a non-blank string
    of at most ``MAX_ID_LENGTH`` characters, and its ``confidence`` is a finite
    number at or above ``floor``. Each fact's ids keep the order of its
    mentions, without duplicates, at most :data:`MAX_ENTITY_IDS`. A mention
    nothing resolved is dropped: it is noise for ranking, not a reason to
    discard the fact.
    """
    by_mention: dict[str, list[str]] = {}
    for resolution in resolutions:
        usable = _usable(resolution, floor)
        if usable is None:
            continue
        key, entity_id = usable
        known = by_mention.setdefault(key, [])
        if entity_id not in known:
            known.append(entity_id)
    anchored: list[list[str]] = []
    for mentions in mentions_per_fact:
        ids: list[str] = []
        for mention in mentions:
            for entity_id in by_mention.get(mention_key(mention), ()):
                if entity_id not in ids and len(ids) < MAX_ENTITY_IDS:
                    ids.append(entity_id)
        anchored.append(ids)
    return anchored
