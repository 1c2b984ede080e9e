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
- a credential named in prose: ``Invalid API key: <k>``, ``api key <k>``, ``password <v>``, ``token <t>``;
- credential headers: ``Ocp-Apim-Subscription-Key: <k>``, ``X-Goog-Api-Key: <k>``, any ``...-key: <k>``;
- keys in URLs: a credential-named query parameter (``?key=``, ``?api_key=``, ``?sig=``, ``?code=``...) and a
  long opaque path segment in a URL (20+ letters, digits or ``_``, such as ``/v1/<key>/completions``);
- well-known token shapes anywhere: OpenAI ``sk-...``, Hugging Face ``hf_...``, GitHub ``ghp_...``, Slack
  ``xox?-...``, AWS access key ids ``AKIA...``, Google ``AIza...``, JSON Web Tokens ``eyJ....eyJ....``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

__all__ = ["MAX_MESSAGE_CHARS", "REDACTED", "redact_secrets", "redact_url", "redirect_message", "safe_message"]

REDACTED: Final[str] = "***"

MAX_MESSAGE_CHARS: Final[int] = 2000
"""Bound on a failure message that crosses a boundary or lands in a ledger, a status or a log line."""

_USERINFO: Final[re.Pattern[str]] = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s@]+@")
_AUTH_SCHEME: Final[re.Pattern[str]] = re.compile(
    r"(?P<scheme>\b(?:bearer|basic|token|apikey|api-key|digest)\s+)"
    r"(?!(?:password|passwd|passphrase|secret|token|key|credentials?)\b)(?![A-Za-z0-9._~+/=-]+:)"
    r"[A-Za-z0-9._~+/=:-]{6,}",
    re.IGNORECASE,
)
"""A scheme and its credential (``Bearer <t>``). Not when the next word names a credential itself or a header (a word
and a colon): in "token password hunter22" or "token X-Api-Key: k3y" the secret is that key's value, which the rules
below redact; taking the key's name for the token would hide the name and leave the secret."""
_KEY_NAMES: Final[str] = (
    r"(?:[a-z0-9_-]*?(?:api[_-]?key|apikey|access[_-]?key|secret[_-]?key|private[_-]?key|client[_-]?secret)"
    r"|(?:access|refresh|id|auth|session|bearer|api|csrf)?[_-]?token|secret|password|passwd|pwd|authorization"
    r"|x-api-key|cookie|set-cookie|session(?:id)?|credentials?)"
)
_KEY_VALUE: Final[re.Pattern[str]] = re.compile(
    rf"(?P<key>\b{_KEY_NAMES}\b[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\s\"'&,;}}\]]{{3,}})", re.IGNORECASE
)
_PROSE_KEY: Final[re.Pattern[str]] = re.compile(
    r"(?P<key>\b(?:api[ _-]?key|access[ _-]?key|secret[ _-]?key|subscription[ _-]?key|private[ _-]?key|key|password"
    r"|passphrase|passwd|token|secret|credentials?)\b(?:\s+(?:provided|given|supplied|used|sent|received))?"
    r"[\"']?(?:\s*(?:is|was|=|:)\s*|\s+)[\"'`]?)"
    r"(?P<value>(?=[^\s\"'`,;]*[0-9_+/=-])[^\s\"'`,;]{6,}|[^\s\"'`,;]{12,})",
    re.IGNORECASE,
)
"""A credential word followed by a value: the value either has a digit or symbol, or is long (so "password reset"
stays readable but "password hunter22" and "key abcdefghijklmnop" do not)."""
_HEADER_KEY: Final[re.Pattern[str]] = re.compile(
    r"(?P<key>\b[A-Za-z0-9-]*(?:key|token|secret|signature|auth)[A-Za-z0-9-]*\s*:\s*)(?P<value>[^\s\"',;]{8,})",
    re.IGNORECASE,
)
_URL_QUERY_KEY: Final[re.Pattern[str]] = re.compile(
    r"(?P<key>[?&](?:[a-z0-9_.-]*(?:key|token|secret|sig|signature|code|auth|pass)[a-z0-9_.-]*)=)(?P<value>[^&#\s\"']+)",
    re.IGNORECASE,
)
_URL: Final[re.Pattern[str]] = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>`]+")
_OPAQUE_SEGMENT: Final[re.Pattern[str]] = re.compile(
    r"(?<=/)(?=[A-Za-z0-9_~.+=-]*[0-9])(?=[A-Za-z0-9_~.+=-]*[A-Za-z])"
    r"(?:[A-Za-z0-9_]{20,}|[A-Za-z0-9_~.+=-]{40,})(?=[/?#;]|$)"
)
"""In a URL's path, a segment mixing letters and digits, of 20+ word characters or 40+ characters of any kind: a
key in the path. Model names (``Llama-3.1-8B-Instruct``) have dots and dashes and stay, so does a long run of
letters (``/pppp...``); outside URLs nothing is cut."""
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
    text = _KEY_VALUE.sub(_keep_key, text)
    text = _URL_QUERY_KEY.sub(_keep_key, text)
    text = _HEADER_KEY.sub(_keep_key, text)
    text = _PROSE_KEY.sub(_keep_key, text)
    text = _URL.sub(_redact_url_path, text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


def _redact_url_path(match: re.Match[str]) -> str:
    url = match[0]
    path_start = url.find("/", url.index("://") + 3)
    return url if path_start < 0 else url[:path_start] + _OPAQUE_SEGMENT.sub(REDACTED, url[path_start:])


def _keep_key(match: re.Match[str]) -> str:
    value = match["value"]
    return match["key"] + (value if value.startswith(REDACTED) else REDACTED)


def redact_url(url: str) -> str:
    """A URL fit for a message: userinfo and credential-looking query parameters replaced."""
    return redact_secrets(url)


def safe_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Foreign text made fit to travel: credentials redacted first, then bounded to ``limit`` (the cut marked)."""
    text = redact_secrets(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def redirect_message(where: str, status: int, headers: Mapping[str, str]) -> str:
    """Why a 3xx is a failure: redirects are never followed, so the message names the status and the host only.

    Only the Location's host is shown (bounded, redacted): its path and query may carry the prompt or a key. A
    relative Location (the same host) shows its path without the query, redacted.
    """
    location = headers.get("Location", "")[:2048]
    try:
        host = urlsplit(location).hostname or ""
    except ValueError:
        host = ""
    if host:
        target = f"to host {safe_message(host, 253)!r}"
    elif location:  # the same host: its path says where (redacted, bounded)
        target = f"to {safe_message(location.split('?', 1)[0], 200)!r} on the same host"
    else:
        target = "without a Location"
    return safe_message(f"{where} answered a redirect (HTTP {status}) {target}; redirects are never followed")
