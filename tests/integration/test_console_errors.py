"""Bad console parameters get clear 4xx pages (HTML, the reason in words), never a stack
trace, and the broker keeps serving."""
from __future__ import annotations

import urllib.error
import urllib.request

import pyarrow as pa
import pytest

from fluvial.client import connect


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture(scope="module")
def table(broker):
    name = "console-errors"
    with connect(broker.flight_url) as client:
        t = client.create_table(name, pa.schema([pa.field("id", pa.int64(), False), pa.field("note", pa.string())]),
                                buckets=2)
        t.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "note": ["a", "b", None]}))
        users = client.create_table(f"{name}-pk", pa.schema([pa.field("id", pa.int64(), False),
                                                             pa.field("region", pa.string(), False),
                                                             pa.field("visits", pa.int64())]),
                                    buckets=2, primary_key=["id", "region"])
        users.upsert(pa.table({"id": pa.array([7], pa.int64()), "region": ["eu"], "visits": pa.array([3], pa.int64())}))
    return name


@pytest.mark.parametrize("path, status, words", [
    ("/tables/no-such-table", 404, "There is no table 'no-such-table'"),
    ("/tables/no-such-table/rows", 404, "There is no table 'no-such-table'"),
    ("/tables/{t}/rows?limit=1000000000", 400, "limit must be between 1 and 1000"),
    ("/tables/{t}/rows?limit=0", 400, "limit must be between 1 and 1000"),
    ("/tables/{t}/rows?limit=ten", 400, "limit must be a whole number"),
    ("/tables/{t}/rows?where=id", 400, "must look like 'column op value'"),
    ("/tables/{t}/rows?where=id+%3E+abc", 400, "does not fit column 'id'"),
    ("/tables/{t}/rows?where=ghost+%3D+1", 400, "has no column 'ghost'"),
    ("/tables/{t}/rows?col=ghost", 400, "has no column 'ghost'"),
    ("/tables/{t}/rows?bucket=7", 400, "has buckets 0-1, not 7"),
    ("/tables/{t}/rows?start=999999", 400, "out of range"),
    ("/tables/{t}/rows?start=yesterday", 400, "start must be a whole number"),
    ("/tables/{t}/lookup?id=1", 400, "has no primary key"),
    ("/tables/{t}-pk/lookup?id=seven&region=eu", 400, "'seven' is not a int64 value for key column 'id'"),
    ("/tables/{t}-pk/lookup?id=7", 400, "give a value for every key column: 'region' is missing"),
    ("/tables/{t}-pk/lookup?id=99999999999999999999999&region=eu", 400, "for key column 'id'"),
    ("/schemas/no-such-subject", 404, "no subject 'no-such-subject'"),
    ("/groups/no-such-group", 404, "no consumer group 'no-such-group'"),
    ("/static/..%2F..%2Fmetrics.py", 404, "no file"),
    ("/no/such/page", 404, "no console page"),
])
def test_bad_parameters_get_clear_error_pages(broker, table, path, status, words):
    code, kind, body = _get(f"{broker.http_url}/console{path.format(t=table)}")
    assert code == status
    assert kind.startswith("text/html")
    assert words.replace("'", "&#39;") in body
    assert "Traceback" not in body and "File \"" not in body
    # The broker keeps serving: the table's page still loads.
    assert _get(f"{broker.http_url}/console/tables/{table}")[0] == 200


def test_filters_and_offsets_that_work(broker, table):
    code, _, body = _get(f"{broker.http_url}/console/tables/{table}/rows?col=id&where=note+not_null&start=earliest")
    assert code == 200
    assert 'data-count="2"' in body
    code, _, body = _get(f"{broker.http_url}/console/health")
    assert code == 200 and '"healthy": true' in body


def test_lookup_by_a_composite_key(broker, table):
    code, _, body = _get(f"{broker.http_url}/console/tables/{table}-pk/lookup?id=7&region=eu")
    assert code == 200 and 'id="lookup-result"' in body and "<td>3</td>" in body
    code, _, body = _get(f"{broker.http_url}/console/tables/{table}-pk/lookup?id=7&region=us")
    assert code == 200 and 'id="lookup-none"' in body
