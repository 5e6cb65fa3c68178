"""Spark's native Fluvial source against a table API with TLS, basic auth and ACLs."""
from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark>=4.0')")


import fluvial.client as fc  # noqa: E402
from fluvial.security.acls import AclOperation as Op  # noqa: E402
from tests.support.certs import make_pki  # noqa: E402
from tests.support.secured_broker import SecuredBroker, tls_security  # noqa: E402

USERS = {"admin": "admin-secret", "reader": "reader-secret"}


def test_spark_reads_and_writes_with_credentials_over_tls(tmp_path, spark):
    pki = make_pki(tmp_path / "pki")
    security = tls_security(pki, flight_tls=True, flight_auth="basic", authorizer=True, super_users=("User:admin",))
    broker = SecuredBroker(tmp_path / "data", security, USERS).start()
    session = spark
    try:
        with fc.connect(broker.flight_url, username="admin", password=USERS["admin"],
                        tls_root_certs=str(pki.ca)) as admin:
            admin.create_table("spark_secure", pa.schema([("id", pa.int64()), ("name", pa.string())]), buckets=2)
            admin.table("spark_secure").append(pa.table({"id": list(range(100)), "name": ["x"] * 100}))
        broker.allow("reader", Op.READ, "spark_secure")

        def reader(user: str | None, password: str | None = None):
            r = (session.read.format("fluvial").option("url", broker.flight_url).option("table", "spark_secure")
                 .option("tlsRootCerts", str(pki.ca)))
            if user is not None:
                r = r.option("username", user).option("password", password or USERS[user])
            return r

        assert reader("reader").load().count() == 100
        assert reader("reader").load().agg({"id": "sum"}).collect()[0][0] == sum(range(100))
        with pytest.raises(Exception, match="authentication required"):
            reader(None).load()
        with pytest.raises(Exception, match="invalid username or password"):
            reader("reader", "wrong").load()
        # A write needs WRITE: the reader is refused, the admin appends.
        rows = session.createDataFrame([(1000, "w")], "id long, name string")
        with pytest.raises(Exception, match="not authorized to WRITE"):
            (rows.write.format("fluvial").option("url", broker.flight_url).option("table", "spark_secure")
             .option("tlsRootCerts", str(pki.ca)).option("username", "reader").option("password", USERS["reader"])
             .mode("append").save())
        (rows.write.format("fluvial").option("url", broker.flight_url).option("table", "spark_secure")
         .option("tlsRootCerts", str(pki.ca)).option("username", "admin").option("password", USERS["admin"])
         .mode("append").save())
        assert reader("reader").load().count() == 101
    finally:
        broker.stop()
