"""The credential filter, under the name extraction has always imported it by.

The filter itself is :mod:`harbor_pg.credentials` (layer 0): every write of
long-term memory passes it, the rolling summary (``context/``) too, and
``context/`` may not import a peer.
"""

from __future__ import annotations

from harbor_pg.credentials import (
    SECRET_KINDS,
    contains_secret,
    secret_kind,
    without_secret_sentences,
)

__all__ = ["SECRET_KINDS", "contains_secret", "secret_kind", "without_secret_sentences"]
