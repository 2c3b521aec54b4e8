"""A deterministic credential filter: the last gate before a fact is stored.

The extraction prompt already tells the model never to propose secrets, but a
prompt is a request, not a guarantee (and the conversation may be adversarial),
so every proposed fact also passes this filter. It only looks for shapes that
credentials actually take -- vendor key prefixes, tokens, key blocks, stated
passwords, PINs and other numeric codes, multi-word passphrases, answers to
security questions, ``login is <user> / <secret>`` pairs, URLs with a
password, long random strings -- so ordinary sentences that merely talk
*about* passwords, PINs or keys are left alone ("the PIN pad is broken",
"passphrase-based encryption is on the roadmap").

It is a heuristic in both directions. Where a sentence is ambiguous, the rules
below lean towards refusing it only when it has the grammar of a disclosure
("<keyword> is <value>"), because a refused fact is merely not remembered
while a stored secret is read back into every later prompt.

All patterns are linear-time (no unbounded nested quantifiers), and the checks
on a match read the text around it in place rather than copying the rest of
it, so scanning untrusted text of any length cannot be turned into a denial
of service.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable

__all__ = ["SECRET_KINDS", "contains_secret", "secret_kind", "without_secret_sentences"]

# Each detector: (kind, pattern, optional check on the match). Order matters:
# the more specific vendor prefixes come before the generic shapes they overlap.
_Check = Callable[[re.Match[str]], bool]

_ANTHROPIC = re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}")
_OPENAI = re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}")
_AWS_ACCESS_KEY = re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AIDA|AROA)[0-9A-Z]{16}\b")
_AWS_SECRET_KEY = re.compile(
    r"aws_?secret_?(?:access_?)?key\b[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])",
    re.IGNORECASE,
)
_GITHUB = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")
_SLACK_TOKEN = re.compile(r"\bxox[abposer]-[A-Za-z0-9-]{10,}")
_SLACK_WEBHOOK = re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/\w+")
_GOOGLE = re.compile(r"\bAIza[0-9A-Za-z_-]{35}")
_STRIPE = re.compile(r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}")
_PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*")
_BEARER = re.compile(r"\bbearer\s+(?P<value>[A-Za-z0-9._~+/-]{16,}=*)", re.IGNORECASE)
_BASIC_AUTH = re.compile(r"\bauthorization:\s*basic\s+[A-Za-z0-9+/]{8,}=*", re.IGNORECASE)
# scheme://user:password@host; the user part may be empty (redis://:pw@host)
_URL_CREDENTIALS = re.compile(
    r"\b[a-z][a-z0-9+.-]{1,30}://(?P<user>[^\s:/@?#]*):(?P<value>[^\s@/?#]+)@[^\s@]+",
    re.IGNORECASE,
)
_PASSWORD = re.compile(
    r"\b(?:password|passwd|passphrase|pwd|pass ?code|passcode)"
    # an optional qualifier: "password for the staging db is ..."
    r"(?:\s+(?:for|of|to|on)\s+(?:the\s+|my\s+|our\s+|his\s+|her\s+|their\s+)?[\w.@-]{1,40}"
    r"(?:\s+[\w.@-]{1,40})?)?"
    r"[\"']?\s*(?P<op>\bis\b|\bwas\b|:=|=|:|->)\s*(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|`[^`\n]{1,200}`|\S{1,200})",
    re.IGNORECASE,
)
_ASSIGNMENT = re.compile(
    r"\b(?:api[_-]?key|apikey|secret(?:[_-]?key)?|client[_-]?secret|access[_-]?token|"
    r"auth[_-]?token|refresh[_-]?token|private[_-]?key|token)"
    r"[\"']?\s*[:=]\s*[\"']?(?P<value>[A-Za-z0-9_\-+/=.]{16,})",
    re.IGNORECASE,
)
# "password for the staging db is ..." -- shared by the stated-value rules below;
# its words never swallow the verb that follows it
_QUALIFIER_WORD = r"(?!(?:is|are|was|were)\b)[\w.@-]{1,40}"
_QUALIFIER = (
    r"(?:\s{1,10}(?:for|of|to|on)\s{1,10}(?:the\s+|my\s+|our\s+|his\s+|her\s+|their\s+)?"
    + _QUALIFIER_WORD
    + r"(?:\s{1,10}"
    + _QUALIFIER_WORD
    + r")?)?"
)
_OPERATOR = r"[\"']?\s{0,10}(?P<op>\bis\b|\bwas\b|:=|=|:|->)\s{0,10}"
# A stated numeric code: "my PIN is 4821", "door code: 0417", "CVV = 123".
_PIN = re.compile(
    r"\b(?:pin(?:\s{1,3}(?:code|number|no\.?))?|pass\s?code|puk(?:\s{1,3}code)?|"
    r"(?:door|gate|alarm|garage|entry|access|unlock|security|safe|locker|lock|keypad|"
    r"voicemail|sim)\s{1,3}code|combination|cvv2?|cvc2?|csc)"
    + _QUALIFIER
    + _OPERATOR
    + r"#?(?P<value>\d(?:[ -]?\d){2,15})(?![\w%])",
    re.IGNORECASE,
)
# "PIN 4821" with no verb: only the upper-case acronym (a lower-case "pin 17" is
# a connector pin far more often than a code).
_BARE_PIN = re.compile(r"\bPIN(?:\s{1,3}(?:code|number))?:?\s{1,3}#?(?P<value>\d{4,12})(?![\w%])")
# A passphrase of several ordinary words: "passphrase purple monkey dishwasher",
# "the wifi passphrase is correct horse battery staple". "passphrase-based" is
# not a passphrase (no hyphen after the keyword).
_PASSPHRASE = re.compile(
    r"\b(?:pass[ -]?phrase|seed\s{1,3}phrase|recovery\s{1,3}phrase|mnemonic\s{1,3}phrase)"
    r"(?![\w-])"
    + _QUALIFIER
    + r"(?:[\"']?\s{0,10}(?P<op>\bis\b|\bwas\b|:=|=|:|->))?"
    + r"\s{0,10}[\"'`]?(?P<value>[A-Za-z]{1,40}(?:[ \t]{1,3}[A-Za-z]{1,40}){2,23})",
    re.IGNORECASE,
)
# The answer to a knowledge-based authentication question.
_SECURITY_ANSWER = re.compile(
    r"\b(?:(?:security|secret|challenge)\s{1,3}(?:question\s{1,3})?answers?|"
    r"answer\s{1,3}to\s{1,3}(?:(?:my|the|his|her|their|our|your|a)\s{1,3})?"
    r"(?:security|secret|challenge)\s{1,3}question"
    r"(?:\s{1,3}(?:about|on|for)(?:\s{1,3}(?!(?:is|was)\b)[\w'-]{1,40}){1,4})?|"
    r"security\s{1,3}question\b[^.;\n]{0,80}?\banswer|"
    r"mother['\u2019]?s\s{1,3}maiden\s{1,3}name)"
    + _QUALIFIER
    + _OPERATOR
    + r"(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|`[^`\n]{1,200}`|\S{1,200})",
    re.IGNORECASE,
)
# "creds are admin / S3cr3t!pass", "login: dana@example.com:hunter22"
_CREDENTIAL_PAIR = re.compile(
    r"\b(?:creds?|credentials?|log-?in|logon|sign-?in|"
    r"user(?:name)?\s{0,3}(?:/|and|&)\s{0,3}pass(?:word)?)"
    + _QUALIFIER
    + r"[\"']?\s{0,10}(?P<op>\bis\b|\bare\b|\bwas\b|\bwere\b|:=|=|:|->)\s{0,10}[\"'`]?"
    + r"(?P<user>[^\s/:|\"'`]{1,64})\s{0,3}(?P<sep>[/:|])\s{0,3}(?P<value>[^\s\"'`]{1,200})",
    re.IGNORECASE,
)
# "Dana uses Tr0ub4dor&3 as her password", "4821 as the PIN": the value comes first
_SECRET_KEYWORD = (
    r"(?:password|passwd|passphrase|pass\s?code|pin(?:\s{1,3}(?:code|number))?)(?![\w-])"
)
# (the pattern starts at "as"; the value is read backwards from there by the check,
# since a pattern opening with the value would try it at every position of the text)
_AS_PASSWORD = re.compile(
    r"(?<=\S)\s{1,10}as\s{1,10}(?:(?:my|his|her|their|our|your|the|a|an|its)\s{1,10})?"
    r"(?:[\w.-]{1,40}['\u2019]s\s{1,10})?(?:(?!as\b)[\w-]{1,40}\s{1,3})?" + _SECRET_KEYWORD,
    re.IGNORECASE,
)
# "password is now hunter22", "her PIN was still 4821", "password is: Tr0ub4dor": an
# adverb or a colon between the verb and the value
_PASSWORD_NOW = re.compile(
    r"\b" + _SECRET_KEYWORD + r"\s{1,10}(?:is|was)\s{0,10}"
    r"(?::\s{0,10}|(?:now|still|currently|actually|simply|just|set\s{1,3}to|changed\s{1,3}to)"
    r"\s{1,10}:?\s{0,10})"
    r"(?P<value>\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|`[^`\n]{1,200}`|\S{1,200})",
    re.IGNORECASE,
)
_LONG_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=]{32,}")
_KEYWORD_NEAR = re.compile(r"(?:key|token|secret|password|credential|auth|apikey)", re.IGNORECASE)
_HEX_OR_UUID = re.compile(r"[0-9a-fA-F-]+")
_WORDISH_RUN = re.compile(r"[A-Z]?[a-z]{3,}")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# What commonly follows "password is" in a sentence that states no password.
_NOT_A_PASSWORD = _words(
    """
    a an the not no never now also only still just too very quite required needed
    necessary mandatory optional missing wrong incorrect invalid valid correct
    expired expiring set unset empty blank same different weak strong secure
    insecure long short easy hard simple complex unknown known hidden masked
    redacted stored saved kept hashed encrypted salted changed reset rotated
    managed shared sent reused case sensitive insensitive at least most more less
    in on of for with by to from under inside being be been your my our their his
    her its this that these those which what who whatever something nothing
    none null nil n/a tbd pending available unavailable disabled enabled
    configured generated random secret private protected ok okay fine good bad
    one two three four five six seven eight nine ten eleven twelve sixteen twenty
    """
)
_LENGTH_UNITS = _words("characters character chars char digits digit letters letter symbols long")
_PLACEHOLDER = re.compile(
    r"^(?:\*+|x+|\.+|<[^>]*>|\{[^}]*\}|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_]+%?|\[[^\]]*\])$",
    re.IGNORECASE,
)


_NEXT_WORD = re.compile(r"\s{0,20}(\S{1,40})")
_CONTINUES = re.compile(r"[ \t]{0,20}[^\W_]")


def _next_word(match: re.Match[str]) -> str:
    """The word right after ``match``, lower-cased and unpunctuated ('' when none).

    Read in place: copying the rest of the text per match would make a scan of
    text with many matches quadratic.
    """
    found = _NEXT_WORD.match(match.string, match.end())
    return found.group(1).lower().strip(".,;:") if found else ""


def _strip_value(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        return value[1:-1]
    return value.rstrip(".,;:!?)]}\"'`").lstrip("([{\"'`")


def _is_placeholder(value: str) -> bool:
    return not value or bool(_PLACEHOLDER.match(value))


def _password_value(match: re.Match[str]) -> bool:
    raw = match.group("value")
    quoted = raw[:1] in "\"'`" and raw[-1:] == raw[:1] and len(raw) >= 2
    value = _strip_value(raw)
    if _is_placeholder(value):
        return False
    if quoted:
        return True
    lowered = value.lower()
    if lowered in _NOT_A_PASSWORD:
        return False
    if value.isdigit():
        # "the password is 12 characters long" states a length, not a password
        if _next_word(match) in _LENGTH_UNITS:
            return False
        return len(value) >= 4
    if value.isalpha() and value.islower():
        # participles and adverbs ("is stored", "is rarely") describe; they do not disclose
        return not lowered.endswith(("ed", "ing", "ly"))
    return True


def _pin_value(match: re.Match[str]) -> bool:
    # "the PIN is 4821 digits long" would state a length, not a PIN
    return _next_word(match) not in _LENGTH_UNITS


# Words that end a run of passphrase words: what a sentence *about* a passphrase
# says next ("is being reset", "must be long", "protection is enabled").
_SENTENCE_WORDS = _words(
    """
    and or but nor so yet if then than as at into onto over about after before
    during since until while when where why how because though although whether
    is are was were be am do does did done has have had having can could will
    would shall should may might must need needs get gets got make makes made
    use uses used require requires show shows work works support supports
    protect protects help helps keep keeps go goes come comes appear appears
    it its it's he she they them we us you i me him
    each every any all some many few several both either neither other another
    such own here there today yesterday tomorrow again always sometimes often
    rarely usually please thanks
    """
)
# "correct" is the first word of the best-known passphrase of all.
_FUNCTION_WORDS = (_NOT_A_PASSWORD | _SENTENCE_WORDS) - _words("correct")
_DETERMINERS = _words("a an the this that these those each every any no which what whose")


def _passphrase_value(match: re.Match[str]) -> bool:
    """Three or more ordinary words stated as a passphrase, not a sentence about one."""
    words = match.group("value").split()
    stated = match.group("op") is not None
    run = 0
    for word in words:
        lowered = word.lower()
        participle = lowered.endswith(("ed", "ing", "ly"))
        if lowered in _FUNCTION_WORDS or (participle and (run == 0 or not stated)):
            break
        run += 1
    if run < 3:
        return False
    if stated:
        return True
    # No verb ("passphrase purple monkey dishwasher"): only a bare label counts.
    # A determiner before the keyword makes it a noun phrase ("the passphrase
    # prompt appears twice"), and the words must be the whole clause.
    if run < len(words):
        return False
    if _CONTINUES.match(match.string, match.end()):
        return False
    # the words before the keyword, back to the start of its clause (bounded)
    before = match.string[max(0, match.start() - 80) : match.start()]
    clause = re.split(r"[.;:!?,\n(]", before)[-1].lower().split()
    return not any(w in _DETERMINERS for w in clause)


# Generic words that name the shape of a login rather than fill it
# ("login is username/password", "credentials are read/write").
_NOT_A_LOGIN_SECRET = _words(
    """
    password passwd pass pwd passphrase secret token key pin code otp mfa 2fa totp
    read write readonly execute admin user username email phone
    """
)
# Account names that make even an all-letter secret a credential ("root / toor").
_DEFAULT_ACCOUNTS = _words(
    "admin administrator root sa postgres guest test demo pi ubuntu ec2-user superuser"
)
_SECRET_SYMBOL = re.compile(r"[0-9!@#$%^&*+=?~<>]")


def _credential_pair_value(match: re.Match[str]) -> bool:
    user = _strip_value(match.group("user"))
    value = _strip_value(match.group("value"))
    if match.group("sep") == ":" and value.startswith("//"):
        return False  # a URL ("login: https://..."), handled by connection_string
    if _is_placeholder(user) or _is_placeholder(value) or len(value) < 4:
        return False
    if not any(c.isalpha() for c in user):
        return False  # "credentials: 2024/05/01" is a date, not a user name
    if value.lower() in _NOT_A_LOGIN_SECRET or value.lower().endswith(("ed", "ing", "ly")):
        return False
    if _SECRET_SYMBOL.search(value):
        return True
    return user.lower() in _DEFAULT_ACCOUNTS


def _stated_secret_value(match: re.Match[str]) -> bool:
    """The value after "password is now ..." (see :func:`_looks_like_secret`)."""
    return _looks_like_secret(match.group("value"), match)


def _looks_like_secret(raw: str, match: re.Match[str]) -> bool:
    """A value in a looser password shape: quoted, a numeric code, or a word with a
    digit or a symbol; plain words are left alone ("her birthday as her password")."""
    if raw[:1] in "\"'`" and raw[-1:] == raw[:1] and len(raw) >= 2:
        return not _is_placeholder(raw[1:-1])
    value = _strip_value(raw)
    if _is_placeholder(value) or value.lower() in _NOT_A_PASSWORD:
        return False
    if value.isdigit():
        return len(value) >= 4 and _next_word(match) not in _LENGTH_UNITS
    return len(value) >= 4 and bool(_SECRET_SYMBOL.search(value))


def _as_password_value(match: re.Match[str]) -> bool:
    """The word (or quoted text) before "as her password", checked as a stated value."""
    before = match.string[max(0, match.start() - 202) : match.start()]
    quote = before[-1:]
    if quote in ('"', "'", "`"):
        opening = before.rfind(quote, 0, len(before) - 1)
        if opening >= 0 and "\n" not in before[opening:]:
            return _looks_like_secret(before[opening:], match)
    value = before[max(before.rfind(" "), before.rfind("\t"), before.rfind("\n")) + 1 :]
    return bool(value) and _looks_like_secret(value, match)


def _bearer_value(match: re.Match[str]) -> bool:
    value = match.group("value")
    return any(c.isdigit() for c in value) or len(value) >= 24


def _url_value(match: re.Match[str]) -> bool:
    value = _strip_value(match.group("value"))
    return not _is_placeholder(value)


def _assignment_value(match: re.Match[str]) -> bool:
    value = match.group("value")
    return any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


def _entropy(text: str) -> float:
    counts = Counter(text)
    total = len(text)
    return -sum(n / total * math.log2(n / total) for n in counts.values())


def _random_looking(token: str, text: str, start: int) -> bool:
    """True for a long token that looks generated rather than written."""
    core = token.strip("=-_+/")
    if len(core) < 32:
        return False
    has_digit = any(c.isdigit() for c in core)
    has_lower = any(c.islower() for c in core)
    has_upper = any(c.isupper() for c in core)
    if _HEX_OR_UUID.fullmatch(core):
        # Commit ids, content hashes and UUIDs are hex too and are fine to remember;
        # a hex string is only treated as a secret when a keyword says it is one.
        before = text[max(0, start - 40) : start]
        return bool(_KEYWORD_NEAR.search(before))
    if not has_digit or not (has_lower or has_upper):
        return False
    if _entropy(core) < 3.5:
        return False
    # Identifiers and paths are mostly word-like runs; random strings are not.
    wordish = sum(len(m.group()) for m in _WORDISH_RUN.finditer(core))
    return wordish / len(core) < 0.5


_DETECTORS: tuple[tuple[str, re.Pattern[str], _Check | None], ...] = (
    ("private_key", _PRIVATE_KEY, None),
    ("anthropic_api_key", _ANTHROPIC, None),
    ("openai_api_key", _OPENAI, None),
    ("aws_access_key", _AWS_ACCESS_KEY, None),
    ("aws_secret_key", _AWS_SECRET_KEY, None),
    ("github_token", _GITHUB, None),
    ("slack_token", _SLACK_TOKEN, None),
    ("slack_webhook", _SLACK_WEBHOOK, None),
    ("google_api_key", _GOOGLE, None),
    ("stripe_secret_key", _STRIPE, None),
    ("jwt", _JWT, None),
    ("bearer_token", _BEARER, _bearer_value),
    ("basic_auth", _BASIC_AUTH, None),
    ("connection_string", _URL_CREDENTIALS, _url_value),
    ("credential_pair", _CREDENTIAL_PAIR, _credential_pair_value),
    ("password", _PASSWORD, _password_value),
    ("password", _PASSWORD_NOW, _stated_secret_value),
    ("password", _AS_PASSWORD, _as_password_value),
    ("pin", _PIN, _pin_value),
    ("pin", _BARE_PIN, _pin_value),
    ("passphrase", _PASSPHRASE, _passphrase_value),
    ("security_answer", _SECURITY_ANSWER, _password_value),
    ("credential_assignment", _ASSIGNMENT, _assignment_value),
)

# For each detector, words one of which every match holds (lower-cased): a detector
# whose words are all absent from a text cannot match it and is not run (each
# pattern opens with an alternation the regular-expression engine tries at every
# position: 10-40 us a sentence, most of a one-memory save). Only for ASCII text:
# with IGNORECASE a pattern also matches non-ASCII letters that fold to ASCII ones
# (the Kelvin sign to "k"), which lower() does not map, so other text runs every
# detector. tests/unit/test_secrets.py checks the words against each pattern.
_NEEDLES: dict[re.Pattern[str], tuple[str, ...]] = {
    _PRIVATE_KEY: ("-----begin ",),
    _ANTHROPIC: ("sk-ant-",),
    _OPENAI: ("sk-",),
    _AWS_ACCESS_KEY: ("akia", "asia", "abia", "acca", "aida", "aroa"),
    _AWS_SECRET_KEY: ("aws",),
    _GITHUB: ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    _SLACK_TOKEN: ("xox",),
    _SLACK_WEBHOOK: ("hooks.slack.com/services/",),
    _GOOGLE: ("aiza",),
    _STRIPE: ("_live_", "_test_"),
    _JWT: ("eyj",),
    _BEARER: ("bearer",),
    _BASIC_AUTH: ("authorization:",),
    _URL_CREDENTIALS: ("://",),
    _CREDENTIAL_PAIR: ("cred", "log", "sign", "user"),
    _PASSWORD: ("pass", "pwd"),
    _PASSWORD_NOW: ("pass", "pin"),
    _AS_PASSWORD: ("pass", "pin"),
    _PIN: ("pin", "pass", "puk", "code", "combination", "cvv", "cvc", "csc"),
    _BARE_PIN: ("pin",),
    _PASSPHRASE: ("phrase",),
    _SECURITY_ANSWER: ("answer", "maiden"),
    _ASSIGNMENT: ("key", "secret", "token"),
}

# every word once, and each detector with its words as a set: a text's words are found
# in one pass over the list (45 substring tests, about 3 us), then each detector is
# skipped by a set test (one any() a detector cost about 15 us a sentence)
_WORDS: tuple[str, ...] = tuple(dict.fromkeys(w for ws in _NEEDLES.values() for w in ws))
_SCREENED: tuple[tuple[str, re.Pattern[str], _Check | None, frozenset[str]], ...] = tuple(
    (kind, pattern, check, frozenset(_NEEDLES[pattern])) for kind, pattern, check in _DETECTORS
)

#: Every kind :func:`secret_kind` may return.
SECRET_KINDS: tuple[str, ...] = (
    *dict.fromkeys(kind for kind, _, _ in _DETECTORS),
    "high_entropy_token",
)


def secret_kind(text: str) -> str | None:
    """Name the first kind of credential found in ``text``, or ``None``.

    Kinds are listed in :data:`SECRET_KINDS`: vendor API keys (OpenAI,
    Anthropic, AWS, GitHub, Slack, Google, Stripe), JWT and bearer tokens,
    private key blocks, stated passwords, stated PINs and other numeric codes
    (door, alarm, CVV, ...), passphrases of three or more words, answers to
    security questions (including a mother's maiden name), ``creds are
    <user> / <secret>`` pairs, URLs with an embedded password,
    ``api_key=...``-style assignments, and generated-looking tokens of 32 or
    more characters.
    """
    if not text:
        return None
    lowered = text.lower() if text.isascii() else None
    present = None if lowered is None else {w for w in _WORDS if w in lowered}
    for kind, pattern, check, words in _SCREENED:
        if present is not None and present.isdisjoint(words):
            continue
        for match in pattern.finditer(text):
            if check is None or check(match):
                return kind
    for match in _LONG_TOKEN.finditer(text):
        if _random_looking(match.group(), text, match.start()):
            return "high_entropy_token"
    return None


def contains_secret(text: str) -> bool:
    """True when ``text`` appears to contain a credential (see :func:`secret_kind`)."""
    return secret_kind(text) is not None


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def without_secret_sentences(text: str) -> tuple[str, str | None]:
    """``text`` without the sentences that hold a credential, and the first kind found.

    For derived text that is stored without a caller to refuse it (the rolling
    session summary): each line is kept whole when it holds no credential, else
    split into sentences and the ones with a credential dropped. When the
    remainder still holds one (a credential the filter only sees across
    sentences), the result is empty. The kind is ``None`` when nothing was
    dropped.
    """
    kind = secret_kind(text)
    if kind is None:
        return text, None
    lines = []
    for line in text.split("\n"):
        if secret_kind(line) is None:
            lines.append(line)
            continue
        kept = [s for s in _SENTENCE_END.split(line) if secret_kind(s) is None]
        if kept:
            lines.append(" ".join(kept))
    rest = "\n".join(lines).strip()
    if secret_kind(rest) is not None:
        return "", kind
    return rest, kind
