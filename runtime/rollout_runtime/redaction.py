"""Keep credentials out of failure reasons, ledgers, logs, Events and statuses.

Failure messages carry text from the network: a shard's error body ("invalid api key sk-..."), an upstream's
echo of the request's ``Authorization`` header, a URL with ``user:password@`` in it, a redirect's ``Location``.
Those messages end in the failure ledger, the trainer's logs, a custom resource's ``status.lastError`` and
Kubernetes Events, which far more people can read than the credential's owner. So every place that turns foreign
text into a message passes it through :func:`redact_secrets` first; :data:`REDACTED` replaces what it removes.

What counts as a secret (deliberately broad: a false positive costs a few characters of a message):

- URL userinfo: ``scheme://user:pass@host`` -> ``scheme://***@host``;
- an auth scheme and its credential: ``Bearer <token>``, ``Basic <b64>``, ``Token <t>``, ``ApiKey <k>``;
- ``key=value`` / ``"key": "value"`` where the key names a credential (api_key, token, secret, password,
  authorization, x-api-key, access_key, session, cookie, ...);
- well-known token shapes anywhere: OpenAI ``sk-...``, Hugging Face ``hf_...``, GitHub ``ghp_...``, Slack
  ``xox?-...``, AWS access key ids ``AKIA...``, Google ``AIza...``, JSON Web Tokens ``eyJ....eyJ....``.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_MESSAGE_CHARS", "REDACTED", "redact_secrets", "redact_url", "safe_message"]

REDACTED: Final[str] = "***"

MAX_MESSAGE_CHARS: Final[int] = 2000
"""Bound on a failure message that crosses a boundary or lands in a ledger, a status or a log line."""

_USERINFO: Final[re.Pattern[str]] = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s@]+@")
_AUTH_SCHEME: Final[re.Pattern[str]] = re.compile(
    r"(?P<scheme>\b(?:bearer|basic|token|apikey|api-key|digest)\s+)[A-Za-z0-9._~+/=:-]{6,}", re.IGNORECASE
)
_KEY_NAMES: Final[str] = (
    r"(?:[a-z0-9_-]*?(?:api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|client[_-]?secret)"
    r"|(?:access|refresh|id|auth|session|bearer|api|csrf)?[_-]?token|secret|password|passwd|pwd|authorization"
    r"|x-api-key|cookie|set-cookie|session(?:id)?|credentials?)"
)
_KEY_VALUE: Final[re.Pattern[str]] = re.compile(
    rf"(?P<key>\b{_KEY_NAMES}\b[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\s\"'&,;}}\]]{{3,}})", re.IGNORECASE
)
_TOKEN_SHAPES: Final[re.Pattern[str]] = re.compile(
    r"\b(?:"
    r"sk-[A-Za-z0-9_-]{12,}"  # OpenAI and compatible
    r"|hf_[A-Za-z0-9]{16,}"  # Hugging Face
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_-]{30,}"  # Google API key
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JSON Web Token
    r")"
)


def redact_secrets(text: str) -> str:
    """``text`` with every credential it recognisably contains replaced by :data:`REDACTED` (idempotent)."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m['scheme']}{REDACTED}", text)
    text = _KEY_VALUE.sub(lambda m: m["key"] + (m["value"] if m["value"] == REDACTED else REDACTED), text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


def redact_url(url: str) -> str:
    """A URL fit for a message: userinfo and credential-looking query parameters replaced."""
    return redact_secrets(url)


def safe_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Foreign text made fit to travel: credentials redacted first, then bounded to ``limit`` (the cut marked)."""
    text = redact_secrets(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
