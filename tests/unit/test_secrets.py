"""The deterministic credential filter: positives, benign look-alikes, robustness."""

from __future__ import annotations

import base64
import random
import string
import time

import pytest

from harbor_pg.extraction.secrets import SECRET_KINDS, contains_secret, secret_kind

# Assembled at run time so secret scanners do not flag this file itself.
OPENAI = "sk-" + "proj-" + "AbCdEf1234567890GhIjKlMnOp"
ANTHROPIC = "sk-" + "ant-api03-" + "abcdefghijklmnopqrstuvwxyz012345"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
GITHUB = "ghp_" + "abcdefghijklmnopqrstuvwxyz0123456789"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
SLACK = "xoxb-" + "1234567890-abcdefghij"
GOOGLE = "AIza" + "SyA1234567890abcdefghijklmnopqrstuv"
STRIPE = "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = (
    "eyJhbGciOiJIUzI1NiJ9"
    + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"My OpenAI key is {OPENAI}", "openai_api_key"),
        (f"OPENAI_API_KEY={OPENAI}", "openai_api_key"),
        (f"use {ANTHROPIC} for claude", "anthropic_api_key"),
        (f"{AWS_ID} is the access key id", "aws_access_key"),
        (f"aws_secret_access_key = {AWS_SECRET}", "aws_secret_key"),
        (f"export AWS_SECRET_ACCESS_KEY='{AWS_SECRET}'", "aws_secret_key"),
        (f"the CI token is {GITHUB}", "github_token"),
        (GITHUB_PAT, "github_token"),
        ("gho_" + "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8", "github_token"),
        (f"slack bot token {SLACK}", "slack_token"),
        ("https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXX", "slack_webhook"),
        (f"maps key {GOOGLE}", "google_api_key"),
        (f"stripe {STRIPE}", "stripe_secret_key"),
        ("rk_" + "test_" + "51Habcdefghijklmnop", "stripe_secret_key"),
        ("Authorization: Bearer abcdef1234567890abcdef", "bearer_token"),
        ("bearer 9f8e7d6c5b4a39281706f5e4", "bearer_token"),
        (f"session cookie {JWT}", "jwt"),
        (PEM, "private_key"),
        ("-----BEGIN " + "OPENSSH PRIVATE KEY-----", "private_key"),
        ("-----BEGIN " + "PRIVATE KEY-----", "private_key"),
        ("-----BEGIN " + "PGP PRIVATE KEY BLOCK-----", "private_key"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "basic_auth"),
        ("The password is hunter2", "password"),
        ("my password was swordfish", "password"),
        ("password: correcthorse", "password"),
        ("Password: Tr0ub4dor&3", "password"),
        ("pwd=Tr0ub4dor&3", "password"),
        ("PASSWD = s3cr3t!", "password"),
        ("The password for the staging db is 'correct horse battery'", "password"),
        ("the wifi passphrase is BlueOcean42", "password"),
        ('the password is "required"', "password"),
        ("The password is 839201", "password"),
        ("postgresql://app:s3cret@db.internal:5432/harbor", "connection_string"),
        ("connect with mysql://root:toor@localhost/app", "connection_string"),
        ("redis://:p4ssw0rd@cache:6379/0", "connection_string"),
        ("amqp://guest:guest@rabbit:5672/", "connection_string"),
        ("api_key=abcd1234efgh5678ijkl", "credential_assignment"),
        ('"client_secret": "9a8b7c6d5e4f3a2b1c0d"', "credential_assignment"),
        ("access_token: ya29A0ARrdaM1234567890abcdef", "credential_assignment"),
        ("The deploy value is Zx8Kq2LmN4pR7tY1vB6cW9dF3gH5jS0a", "high_entropy_token"),
        (
            "signing key: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "high_entropy_token",
        ),
    ],
)
def test_detects_credentials(text: str, kind: str) -> None:
    assert secret_kind(text) == kind
    assert contains_secret(text)
    assert kind in SECRET_KINDS


BENIGN = [
    "The user prefers dark mode",
    "The project uses PostgreSQL 18",
    "The password policy requires 12 characters",
    "The password is required for login",
    "The password is at least 12 characters long",
    "The password is 12 characters long",
    "The password must contain a symbol",
    "The user's password was changed yesterday",
    "The user forgot their password",
    "The user's passphrase is being reset",
    "The password is stored in 1Password",
    "The password is case sensitive",
    "Passwords are hashed with argon2",
    "The app supports passwordless login via magic links",
    "The team rotates API keys every 90 days",
    "API keys are kept in HashiCorp Vault",
    "The service uses OAuth bearer tokens",
    "Use Bearer authentication for the API",
    "The bearer of bad news was Alice",
    "Token: expires in 3600 seconds",
    "The token limit is 128000",
    "The secret to good coffee is fresh beans",
    "The user asked about the sk-learn library",
    "Alice works on the risk-assessment-framework-for-banks-2024 project",
    "The fix landed in commit 8e79f68a1b2c3d4e5f60718293a4b5c6d7e8f901",
    "The tarball sha256 is 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "Request 123e4567-e89b-12d3-a456-426614174000 failed with a timeout",
    "The module lives at src/harbor_pg/context/trimming_helpers_v2.py",
    "The class MemoryContextBuilderFactoryV2Implementation is deprecated",
    "The function test_summary_boundary_walks_back_to_the_nearest_user_turn_2 is flaky",
    "The database URL is postgresql://app@db.internal:5432/harbor",
    "DATABASE_URL=postgresql://app:${DB_PASSWORD}@db/harbor",
    "The DSN is postgresql://app:<password>@db/harbor",
    "The service listens on https://example.com:8443/api",
    "The docs are at https://docs.example.com/guide/getting-started/installation",
    "The user's email is ann@example.com",
    "The meeting is at 10:30 in room B",
    "The user said: password reset emails go to spam",
    "Ratio is 3:2 and the key signature is C major",
    "The user lives in Zürich and speaks Schweizerdeutsch",
    "The user's GitHub handle is octocat",
    "The project adopted AWS Lambda for ingestion",
    "",
]


@pytest.mark.parametrize("text", BENIGN)
def test_benign_facts_pass(text: str) -> None:
    assert secret_kind(text) is None
    assert not contains_secret(text)


# -- PINs, passphrases, security answers, login pairs -------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("my PIN is 4821", "pin"),
        ("Dana's PIN is 4821.", "pin"),
        ("pin: 4821", "pin"),
        ("The PIN for my bank card is 0417", "pin"),
        ("PIN 4821", "pin"),
        ("SIM PIN code: 1234", "pin"),
        ("The office door code is 7734", "pin"),
        ("alarm code = 9 9 1 2", "pin"),
        ("The gate code is #2580", "pin"),
        ("The safe combination is 12-34-56", "pin"),
        ("The CVV is 123", "pin"),
        ("the voicemail code was 1357", "pin"),
        ("passphrase purple monkey dishwasher", "passphrase"),
        ("Wifi passphrase: purple monkey dishwasher", "password"),  # the older rule fires first
        ("my passphrase is correct horse battery staple", "passphrase"),
        ("The pass phrase for the vault is correct horse battery staple", "passphrase"),
        ("The recovery phrase is abandon ability able about above absent", "passphrase"),
        ("Dana's seed phrase: correct zebra lamp orbit", "passphrase"),
        ("security answer: Fluffy", "security_answer"),
        ("The security question answer is Rex", "security_answer"),
        ("the answer to my security question is Fluffy", "security_answer"),
        (
            "The answer to the security question about her first pet is 'Mr Whiskers'",
            "security_answer",
        ),
        ("security question: first pet, answer: Rex", "security_answer"),
        ("my mother's maiden name is Smith", "security_answer"),
        ("Dana's mother\u2019s maiden name was Okafor", "security_answer"),
        ("creds are admin / S3cr3t!pass", "credential_pair"),
        ("credentials: admin/S3cr3t!pass", "credential_pair"),
        ("The credentials for the staging db are deploy / Tr0ub4dor", "credential_pair"),
        ("login is dana@example.com : hunter22", "credential_pair"),
        ("Sign-in: dana | p4ss-w0rd", "credential_pair"),
        ("username/password is svc_ingest/Zq!9vv", "credential_pair"),
        ("creds are root / toor", "credential_pair"),  # a default account, all-letter secret
    ],
)
def test_detects_pins_passphrases_answers_and_login_pairs(text: str, kind: str) -> None:
    assert secret_kind(text) == kind
    assert kind in SECRET_KINDS


@pytest.mark.parametrize(
    "text",
    [
        # numbers that are not codes
        "Alice's favourite number is 4821",
        "Dana lives at 4821 Elm Street",
        "The ticket number is 4821",
        "The zip code is 10115",
        "The HTTP status code was 503",
        # talking about PINs and codes
        "the PIN pad is broken",
        "The PIN is 4 digits long",
        "The PIN has 6 digits",
        "The PIN is required for every card payment",
        "Dana changed her PIN on Monday",
        "The door code changes every month",
        "The security code review is scheduled for Friday",
        "The best combination was 1990s music and coffee",
        "The GPIO pin is 17",
        "Pinned dependency: numpy 1.26",
        # talking about passphrases
        "passphrase-based encryption is on the roadmap",
        "Passphrase-protected keys are required on laptops",
        "The user's passphrase is being reset",
        "The passphrase is correct",
        "The passphrase is four random words",
        "The passphrase must be at least five words long",
        "The passphrase prompt appears twice during boot",
        "Passphrase protection is enabled on the laptop",
        "The seed phrase is stored on paper in the safe",
        "Dana set a new passphrase yesterday",
        "Passphrase strength matters more than complexity rules",
        # talking about security questions
        "The security question asks about the first pet",
        "The security answer is case sensitive",
        "The security answer for the bank is her first dog's name",
        "Dana's mother's maiden name is unknown to the bank",
        "Dana answered the security question correctly",
        # talking about logins
        "The credentials are read/write",
        "The login is username/password",
        "Login is via Google/GitHub",
        "The login is Google/GitHub",
        "The credentials are stored in Vault/1Password",
        "Sign-in is email/OTP",
        "login: https://sso.example.com/start",
        "The login is at 10:30",
        "credentials: 2024/05/01 rotation",
        "The credentials are rotated every 90 days",
    ],
)
def test_benign_talk_about_pins_passphrases_and_logins_passes(text: str) -> None:
    assert secret_kind(text) is None


def test_random_generated_tokens_are_caught() -> None:
    rng = random.Random(20260301)
    alphabet = string.ascii_letters + string.digits
    samples = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(32, 64))) for _ in range(500)
    ]
    samples += [base64.b64encode(rng.randbytes(rng.randint(24, 48))).decode() for _ in range(500)]
    caught = sum(contains_secret(f"The value is {token} here") for token in samples)
    assert caught / len(samples) >= 0.97


def test_short_tokens_are_not_generic_secrets() -> None:
    assert secret_kind("The build id is Zx8Kq2LmN4pR7tY1vB6") is None


# The bounds below are on this process's CPU time, not the wall clock: on a
# loaded machine other processes' work inflated wall time past the bound while the
# scan itself stayed linear (a quadratic scan of these inputs takes minutes of CPU).
def test_adversarial_input_scans_in_linear_time() -> None:
    inputs = [
        "password for the x y " * 20_000,
        "://a:" * 40_000,
        "-----BEGIN A " * 20_000,
        "Bearer " * 30_000,
        "A1" * 100_000,
    ]
    started = time.process_time()
    for text in inputs:
        secret_kind(text)
    assert time.process_time() - started < 5.0


@pytest.mark.parametrize(
    "text",
    [
        # many matches whose check looks at the next word: reading it by copying
        # the rest of the text made this quadratic (90 s before the fix)
        "the password is 12 digits, " * 20_000,
        "my PIN is 1234 digits " * 20_000,
        "passphrase " * 30_000,
        "a passphrase purple monkey dishwasher, " * 8_000,
        "my PIN is " * 30_000 + "1",
        "creds are a / " * 30_000,
        "security question " * 20_000,
        "answer to my security question about " * 10_000,
        "1 " * 100_000,
    ],
    ids=lambda text: text[:24].strip(),
)
def test_adversarial_input_for_the_stated_value_rules_scans_in_linear_time(text: str) -> None:
    started = time.process_time()
    secret_kind(text)
    assert time.process_time() - started < 3.0


# -- the words that let a detector be skipped --------------------------------------------


def _corpus() -> list[str]:
    """Every text of this module's parametrized cases, and each with its letters'
    case swapped."""
    texts: list[str] = []
    for value in list(globals().values()):
        for mark in getattr(value, "pytestmark", []):
            if mark.name == "parametrize":
                for case in mark.args[1]:
                    texts += [
                        c
                        for c in (case if isinstance(case, tuple) else (case,))
                        if isinstance(c, str)
                    ]
    return texts + [t.swapcase() for t in texts]


def test_every_match_of_a_detector_holds_one_of_its_words() -> None:
    """secret_kind skips a detector on ASCII text holding none of its words
    (harbor_pg.credentials._NEEDLES); so every match of every detector, on every case
    here, holds one, and the answer is the one running every detector gives."""
    from harbor_pg import credentials

    corpus = _corpus()
    assert len(corpus) > 100
    for text in corpus:
        # (each detector's matches found once for both checks: the corpus holds the
        # adversarial cases of hundreds of kilobytes)
        full = None  # the first kind, in the detectors' order, with a match that checks
        for kind, pattern, check in credentials._DETECTORS:
            words = credentials._NEEDLES[pattern]
            for match in pattern.finditer(text):
                assert any(w in match.group().lower() for w in words), (kind, match.group())
                if full is None and (check is None or check(match)):
                    full = kind
        if full is not None:
            assert secret_kind(text) == full, text


def test_non_ascii_text_runs_every_detector() -> None:
    # the Kelvin sign folds to "k" under IGNORECASE, which lower() does not give
    assert secret_kind("api_\u212aey = " + "A1b2C3d4E5f6G7h8J9k0") == "credential_assignment"
