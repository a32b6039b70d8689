"""Scoped keys (what a tool passes downstream) are an injective function of (principal, key).

Proven by decoding: every scoped key that is not a hash decodes back to exactly the pair it came
from, so no two pairs can share one; hashes carry a prefix no other scoped key can start with.
"""

from __future__ import annotations

import hashlib
from urllib.parse import unquote

from hypothesis import example, given
from hypothesis import strategies as st

from mcp_durable.keys import LOCAL_PRINCIPAL, MAX_KEY_LENGTH, scoped_key

PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
SEPARATORS = st.sampled_from([":", "%", "/", "|", "@", "#", " ", "%3A", "::", "sha256", "fields", "local", "é"])
KEYS = (
    st.lists(st.one_of(PRINTABLE, SEPARATORS), min_size=1, max_size=40)
    .map("".join)
    .filter(lambda k: 1 <= len(k) <= MAX_KEY_LENGTH and k.isascii())
)
PRINCIPALS = st.one_of(
    st.just(LOCAL_PRINCIPAL),
    st.lists(st.one_of(st.characters(), SEPARATORS), min_size=0, max_size=30).map("".join),
)


def _decode(scoped: str) -> tuple[str, str] | None:
    """The (principal, key) a scoped key came from, or None for a hashed one."""
    if scoped.startswith("scoped-sha256:"):
        return None
    if ":" not in scoped or scoped.startswith(("sha256:", "fields:")):
        return LOCAL_PRINCIPAL, scoped
    part, _, key = scoped.partition(":")
    return unquote(part, errors="surrogatepass"), key


@given(PRINCIPALS, KEYS)
@example(principal="\ud800", key="0")
def test_every_scoped_key_decodes_back_to_its_own_principal_and_key(principal: str, key: str) -> None:
    scoped = scoped_key(principal, key)
    assert len(scoped) <= MAX_KEY_LENGTH and scoped.isascii() and scoped.isprintable()
    decoded = _decode(scoped)
    if decoded is None:
        assert scoped == "scoped-sha256:" + hashlib.sha256(_unhashed(principal, key).encode()).hexdigest()
    else:
        assert decoded == (principal, key)


def _unhashed(principal: str, key: str) -> str:
    # The long form that was hashed: the same encoding with the length limit lifted.
    from mcp_durable.keys import _principal_part

    return f"{_principal_part(principal)}:{key}"


@given(PRINCIPALS, KEYS, PRINCIPALS, KEYS)
def test_two_different_pairs_never_share_a_scoped_key(p1: str, k1: str, p2: str, k2: str) -> None:
    if (p1, k1) != (p2, k2):
        assert scoped_key(p1, k1) != scoped_key(p2, k2)


def test_separators_in_principals_and_keys_cannot_make_two_pairs_collide() -> None:
    pairs = [
        ("a", "b:K1"),
        ("a:b", "K1"),  # the reported collision
        ("local", "alice:K1"),
        ("alice", "K1"),  # a stdio key against an HTTP principal
        ("a%3Ab", "K1"),
        ("a:b", "K1"),  # an escape spelled out by hand
        ("sha256", "0" * 64),
        ("local", "sha256:" + "0" * 64),  # a principal named like a derived key
        ("fields", "x"),
        ("local", "fields:x"),
        ("scoped-sha256", "ab"),
        ("", "K1"),
        ("local", ":K1"),
        ("local", "local:K1"),
        ("a" * 250, "K1"),
        ("a" * 251, "K1"),
        ("a" * 250, "K10"),
        ("ünï", "K1"),
        ("%C3%BCn%C3%AF", "K1"),
        ("a/b", "K1"),
        ("a", "/b:K1"),
    ]
    scoped = {scoped_key(p, k) for p, k in pairs}
    assert len(scoped) == len(set(pairs))


def test_common_scoped_keys_are_unchanged_from_earlier_releases() -> None:
    # Existing downstream records stay valid: a principal without `:` or `%`, any key; `local`
    # keys without `:`, and the keys we derive.
    assert scoped_key("alice", "O-1") == "alice:O-1"
    assert scoped_key("alice", "sha256:" + "ab" * 32) == "alice:sha256:" + "ab" * 32
    assert scoped_key("client/user/https-issuer", "k") == "client/user/https-issuer:k"
    assert scoped_key(LOCAL_PRINCIPAL, "O-1") == "O-1"
    assert scoped_key(LOCAL_PRINCIPAL, "sha256:" + "ab" * 32) == "sha256:" + "ab" * 32
    assert scoped_key(LOCAL_PRINCIPAL, "fields:" + "cd" * 32) == "fields:" + "cd" * 32


STEP_NAMES = st.lists(st.one_of(PRINTABLE, SEPARATORS), min_size=1, max_size=20).map("".join)


@given(PRINCIPALS, KEYS, STEP_NAMES)
@example(principal="\ud800", key="0", name="0")  # a lone surrogate (JSON's "\ud800") failed to encode
@example(principal="alice", key="0", name="\udfff")
def test_every_step_key_decodes_back_to_its_principal_key_and_step_name(principal: str, key: str, name: str) -> None:
    from mcp_durable.keys import step_key

    stepped = step_key(principal, key, name)
    assert len(stepped) <= MAX_KEY_LENGTH and stepped.isascii() and stepped.isprintable()
    if stepped.startswith("step-sha256:"):
        return
    scoped, _, encoded_name = stepped.rpartition("/")
    assert unquote(encoded_name, errors="surrogatepass") == name
    assert scoped == scoped_key(principal, key) and _decode(scoped) in ((principal, key), None)


def test_step_keys_of_two_principals_never_meet_even_with_separators_in_step_names() -> None:
    from mcp_durable.keys import step_key

    # Before: `local` key `alice` + step `x:K` gave `alice/x:K`, principal `alice/x`'s scoped key for `K`.
    assert step_key(LOCAL_PRINCIPAL, "alice", "x:K") != scoped_key("alice/x", "K")
    assert step_key("a", "K/x", "y") != step_key("a", "K", "x/y")
    assert step_key("alice", "O-1", "buy label") == "alice:O-1/buy label"  # the common case is unchanged
    assert step_key(LOCAL_PRINCIPAL, "O-1", "notify") == "O-1/notify"
