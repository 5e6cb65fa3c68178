"""`fluvial broker --config FILE` and the security flags: file settings, flags winning over
them, clear errors (exit 2) for bad values, and the warning of an open broker on the network."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fluvial.broker import cli
from tests.support.broker_process import BrokerProcess
from tests.support.certs import make_pki


def _config(argv):
    import argparse
    parser = argparse.ArgumentParser(prog="fluvial")
    sub = parser.add_subparsers(dest="command")
    bp = cli.add_broker_parser(sub)
    args = parser.parse_args(cli.expand_config_file(["broker", *argv], bp))
    return cli.config_from_args(args, bp)


def test_properties_file_and_flags_win(tmp_path):
    pki = make_pki(tmp_path / "pki")
    conf = tmp_path / "broker.properties"
    conf.write_text(f"""# a broker for the team
security.protocol=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512, PLAIN
ssl.certificate.location={pki.server.cert}
ssl.key.location={pki.server.key}
ssl.ca.location={pki.ca}
ssl.client.auth=requested
connections.max.reauth.ms=60000
authorizer.enabled=true
super.users=User:admin;User:CN=ops
allow.everyone.if.no.acl.found=false
http.auth=basic
flight.tls=true
kafka.port=19093
user=admin=admin-secret
""")
    cfg = _config(["--config", str(conf), "--kafka-port", "29093", "--user", "bob=b"])
    sec = cfg.security
    assert cfg.kafka_port == 29093                       # the flag wins over the file
    assert sec.security_protocol == "SASL_SSL" and sec.kafka_tls and sec.kafka_sasl
    assert sec.sasl_enabled_mechanisms == ("SCRAM-SHA-512", "PLAIN")
    assert sec.ssl_certfile == pki.server.cert and sec.ssl_cafile == pki.ca and sec.ssl_client_auth == "requested"
    assert sec.connections_max_reauth_ms == 60000
    assert sec.authorizer and sec.super_users == ("User:admin", "User:CN=ops")
    assert not sec.allow_everyone_if_no_acl_found
    assert sec.http_auth == "basic" and sec.flight_tls and not sec.http_tls
    assert sec.bootstrap_users == {"admin": "admin-secret", "bob": "b"}
    # The default stays open on loopback.
    d = _config([]).security
    assert d.security_protocol == "PLAINTEXT" and not d.any_authentication


@pytest.mark.parametrize("args,message", [
    (["--security-protocol", "KERBEROS"], "invalid choice"),
    (["--sasl-enabled-mechanisms", "GSSAPI"], "unknown mechanism"),
    (["--super-users", "admin"], "TYPE:NAME"),
    (["--user", "nopassword"], "NAME=PASSWORD"),
    (["--security-protocol", "SSL"], "ssl.certificate.location"),
    (["--security-protocol", "SSL", "--ssl-certificate-location", "/nonexistent.pem"], "cannot load"),
    (["--config", "/nonexistent.properties"], "--config"),
    (["--connections-max-reauth-ms", "-1"], "connections.max.reauth.ms"),
])
def test_bad_values_exit_2(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-m", "fluvial.broker", "broker", "--data-dir", str(tmp_path / "d"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr


def test_unknown_key_in_file(tmp_path):
    conf = tmp_path / "b.properties"
    conf.write_text("security.protocol=SASL_PLAINTEXT\nsasl.kerberos.service.name=kafka\n")
    r = subprocess.run([sys.executable, "-m", "fluvial.broker", "broker", "--config", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "b.properties:2: unknown setting 'sasl.kerberos.service.name'" in r.stderr


def test_open_broker_on_the_network_warns(tmp_path):
    b = BrokerProcess(tmp_path / "open", "--host", "0.0.0.0").start()
    b.stop()
    assert "SECURITY WARNING" in b.log_path.read_text()
    b = BrokerProcess(tmp_path / "closed", "--host", "0.0.0.0", "--security-protocol", "SASL_PLAINTEXT",
                      "--http-auth", "basic", "--flight-auth", "basic").start()
    b.stop()
    assert "SECURITY WARNING" not in b.log_path.read_text()
    b = BrokerProcess(tmp_path / "local").start()
    b.stop()
    assert "SECURITY WARNING" not in b.log_path.read_text()


@pytest.mark.parametrize("name", ["users.json", "acls.json"])
def test_unreadable_security_state_stops_start_with_one_clear_line(tmp_path, name):
    """A damaged users or ACL file is not guessed about (no users would lock everyone out; no
    ACLs would open everything): the broker says which file and why, exits 1, no traceback."""
    data = tmp_path / "data"
    data.mkdir()
    (data / name).write_text('{"format": 1, "users": {"alice": 7}, "acls": [{"oops"')
    proc = subprocess.run([sys.executable, "-m", "fluvial.broker.cli", "broker", "--data-dir", str(data),
                           "--kafka-port", "0", "--http-port", "0", "--flight-port", "0", "--log-format", "text"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"cannot start: cannot read the {name.split('.')[0].replace('acls', 'ACLs')} in" in proc.stderr
    assert str(data / name) in proc.stderr
    assert (data / name).read_text().startswith('{"format": 1')   # left as it was, for the operator
