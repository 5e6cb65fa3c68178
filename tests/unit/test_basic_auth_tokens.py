"""Basic credentials, remembered password checks, table API tokens and the subject -> topic
mapping of the HTTP port's ACL checks."""
from __future__ import annotations

import base64

import pytest

from fluvial.broker.flight.auth import TokenSigner, peer_host
from fluvial.broker.http_security import topic_of_subject
from fluvial.client.auth import ConnectionSecurity, token_expiry
from fluvial.security.basic_auth import CredentialsError, PasswordChecker, parse_basic
from fluvial.security.principal import Principal


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def test_parse_basic_header():
    creds = parse_basic(basic("alice:pa:ss wörd"))
    assert (creds.username, creds.password) == ("alice", "pa:ss wörd")
    assert "pa:ss" not in repr(creds)
    for bad in (None, "", "Bearer x", "Basic !!!", basic("no-colon"), basic(":nouser")):
        with pytest.raises(CredentialsError):
            parse_basic(bad)


def test_password_checker_with_the_user_store(tmp_path):
    from fluvial.security.users import UserStore

    store = UserStore.in_data_dir(tmp_path)
    store.set_password("alice", "right")
    checker = PasswordChecker(store.verify_password, store.__contains__)
    assert checker.check(parse_basic(basic("alice:right"))) == Principal.user("alice")
    for wrong in ("alice:wrong", "mallory:right", "alic:eright"):
        with pytest.raises(CredentialsError, match="invalid username or password"):
            checker.check(parse_basic(basic(wrong)))
    assert checker.still_exists("alice")
    store.set_password("alice", "new")
    with pytest.raises(CredentialsError):  # the old password stops working at once
        checker.check(parse_basic(basic("alice:right")))
    store.delete_user("alice")
    assert not checker.still_exists("alice")


def test_tokens_are_signed_expire_and_name_their_expiry():
    now = [1000.0]
    signer = TokenSigner(lifetime_s=60, clock=lambda: now[0])
    token = signer.issue(Principal.user("alice"))
    assert signer.check(token) == Principal.user("alice")
    assert token_expiry(token) == 1060
    payload, _, signature = token.partition(".")
    forged = base64.urlsafe_b64encode(b'{"user":"admin","exp":1060}').rstrip(b"=").decode()
    with pytest.raises(CredentialsError, match="invalid token"):
        signer.check(f"{forged}.{signature}")
    with pytest.raises(CredentialsError, match="invalid token"):
        TokenSigner(clock=lambda: now[0]).check(token)  # another broker's (or a restarted one's) key
    now[0] = 1061
    with pytest.raises(CredentialsError, match="expired"):
        signer.check(token)


class _Context:
    def __init__(self, peer):
        self._peer = peer

    def peer(self):
        return self._peer


def test_peer_host_as_acls_name_hosts():
    assert peer_host(_Context("ipv4:127.0.0.1:5123")) == "127.0.0.1"
    assert peer_host(_Context("ipv6:[::1]:5123")) == "::1"
    assert peer_host(_Context(b"ipv4:10.0.0.7:1")) == "10.0.0.7"


def test_subjects_follow_their_topics():
    assert topic_of_subject("orders-value") == "orders"
    assert topic_of_subject("orders-key") == "orders"
    assert topic_of_subject("my-orders-value") == "my-orders"
    assert topic_of_subject("com.acme.Order") == "com.acme.Order"   # RecordNameStrategy: its own name
    assert topic_of_subject("-value") == "-value"


def test_connection_security_reads_pem_paths_and_text(tmp_path):
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "ca.pem").write_text(pem)
    assert ConnectionSecurity(tls_root_certs=str(tmp_path / "ca.pem")).root_certs_pem() == pem.encode()
    assert ConnectionSecurity(tls_root_certs=pem).root_certs_pem() == pem.encode()
    assert "secret" not in repr(ConnectionSecurity("alice", "secret"))
