"""SCRAM server side against RFC 7677's test vector, and failures of the exchange."""
import base64
import hashlib
import hmac

import pytest

from fluvial.security import scram
from fluvial.security.scram import ScramError, ScramServer


def _rfc7677_credential():
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    return scram.credential_from_password("SCRAM-SHA-256", "pencil", iterations=4096, salt=salt)


def test_rfc7677_vector():
    cred = _rfc7677_credential()
    server = ScramServer("SCRAM-SHA-256", lambda user: cred if user == "user" else None, secret=b"k",
                         server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = server.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                         b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.user == "user"


def _client_exchange(server, user, password, *, mechanism="SCRAM-SHA-512", tamper=None):
    """A SCRAM client written from RFC 5802, to drive the server through whole exchanges."""
    digest = scram.MECHANISMS[mechanism][0]
    cnonce = "fyko+d2lbbFgONRv9qkxdawL"
    bare = f"n={scram.encode_saslname(user)},r={cnonce}"
    sfirst = server.first(("n,," + bare).encode()).decode()
    attrs = dict(a.split("=", 1) for a in sfirst.split(","))
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored = hashlib.new(digest, client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{bare},{sfirst},{without_proof}".encode()
    sig = hmac.new(stored, auth, digest).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, sig))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    if tamper:
        final = tamper(final)
    sfinal = server.final(final)
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    assert sfinal == b"v=" + base64.b64encode(hmac.new(server_key, auth, digest).digest())


@pytest.mark.parametrize("mechanism", list(scram.MECHANISMS))
def test_round_trip_and_failures(mechanism):
    cred = scram.credential_from_password(mechanism, "s3cret", iterations=4096)
    lookup = {"al,i=ce": cred}.get
    _client_exchange(ScramServer(mechanism, lookup, secret=b"k"), "al,i=ce", "s3cret", mechanism=mechanism)
    with pytest.raises(ScramError) as err:
        _client_exchange(ScramServer(mechanism, lookup, secret=b"k"), "al,i=ce", "wrong", mechanism=mechanism)
    assert err.value.error == "invalid-proof"
    # An unknown user fails at the proof, exactly like a wrong password.
    with pytest.raises(ScramError) as err:
        _client_exchange(ScramServer(mechanism, lookup, secret=b"k"), "bob", "s3cret", mechanism=mechanism)
    assert err.value.error == "invalid-proof"
    # A nonce that is not the server's.
    with pytest.raises(ScramError):
        _client_exchange(ScramServer(mechanism, lookup, secret=b"k"), "al,i=ce", "s3cret", mechanism=mechanism,
                         tamper=lambda f: f.replace(b"r=fyko", b"r=xyko"))


def test_credential_of_other_mechanism_is_not_used():
    cred = scram.credential_from_password("SCRAM-SHA-256", "pw", iterations=4096)
    with pytest.raises(ScramError):
        _client_exchange(ScramServer("SCRAM-SHA-512", {"u": cred}.get, secret=b"k"), "u", "pw")


@pytest.mark.parametrize("message,error", [
    (b"p=tls-unique,,n=u,r=x", "channel-binding-not-supported"),
    (b"n,,r=x,n=u", "invalid-encoding"),
    (b"n,,n=u", "invalid-encoding"),
    (b"garbage", "invalid-encoding"),
    (b"\xff\xfe", "invalid-encoding"),
    (b"n,,n=a=ZZb,r=x", "invalid-username-encoding"),
    (b"n,a=other,n=u,r=x", "other-error"),
    (b"n,,n=u,r=x,tokenauth=true", "extensions-not-supported"),
])
def test_malformed_client_first(message, error):
    with pytest.raises(ScramError) as err:
        ScramServer("SCRAM-SHA-256", lambda u: None, secret=b"k").first(message)
    assert err.value.error == error


def test_malformed_client_final():
    server = ScramServer("SCRAM-SHA-256", lambda u: None, secret=b"k")
    with pytest.raises(ScramError):
        server.final(b"c=biws,r=x,p=AAAA")  # before client-first
    server.first(b"n,,n=u,r=x")
    for bad in (b"", b"c=biws", b"c=cD10bHMtdW5pcXVl,r=x,p=AAAA", b"c=biws,r=x,p=!!!"):
        with pytest.raises(ScramError):
            server.final(bad)


def test_minimum_iterations():
    with pytest.raises(ValueError):
        scram.credential_from_password("SCRAM-SHA-256", "pw", iterations=1000)
