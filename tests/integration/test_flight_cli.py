"""`fluvial table ...` and `fluvial scan ...` against a running broker."""
from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

import fluvial.client as fc

# The table tools register with the `fluvial` command when their module is imported.
RUN = "import sys, fluvial.broker.table_cli; from fluvial.broker.cli import main; sys.exit(main(sys.argv[1:]))"


def fluvial(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=timeout)


def test_table_create_describe_scan_drop(broker, topic_name):
    url = ["--url", broker.flight_url]
    made = fluvial("table", "create", topic_name, "--column", "id:long!", "--column", "city:string",
                   "--column", "amount:double", "--buckets", "2", *url)
    assert made.returncode == 0, made.stderr
    assert f"created table {topic_name} (2 bucket(s), Kafka values json)" in made.stdout
    assert topic_name in fluvial("table", "list", *url).stdout.split()

    with fc.connect(broker.flight_url) as client:
        client.table(topic_name).append(pa.table({"id": [1, 2, 3], "city": ["Oslo", None, "Lima"],
                                                  "amount": [5.0, 50.0, 500.0]}), bucket=1)
    described = fluvial("table", "describe", topic_name, *url)
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0] == f"table {topic_name}: log table, 2 bucket(s), Kafka values json"
    assert any(line.split() == ["0", "|", "id", "|", "int64", "|", "False", "|", "integer"] for line in lines)
    assert any(line.split() == ["1", "|", "0", "|", "3"] for line in lines)  # bucket 1: [0, 3)

    scanned = fluvial("scan", topic_name, "--columns", "_offset,city", "--where", "amount >= 50", *url)
    assert scanned.returncode == 0, scanned.stderr
    rows = [line.split(" | ") for line in scanned.stdout.splitlines()]
    assert [c.strip() for c in rows[0]] == ["_offset", "city"]
    assert [[c.strip() for c in r] for r in rows[2:4]] == [["1", "null"], ["2", "Lima"]]
    assert rows[4] == ["(2 rows)"]
    limited = fluvial("scan", topic_name, "--columns", "id", "--limit", "1", *url)
    assert limited.stdout.splitlines()[-1] == "(1 row)"

    bad = fluvial("scan", topic_name, "--columns", "nope", *url)
    assert bad.returncode == 1 and "UnknownColumnError" in bad.stderr and "no column 'nope'" in bad.stderr
    assert fluvial("table", "drop", topic_name, *url).returncode == 0
    gone = fluvial("table", "describe", topic_name, *url)
    assert gone.returncode == 1 and f"Unknown table '{topic_name}'" in gone.stderr


def test_scan_follow_prints_new_rows(broker, topic_name):
    with fc.connect(broker.flight_url) as client:
        t = client.create_table(topic_name, pa.schema([("n", pa.int64())]))
        proc = subprocess.Popen([sys.executable, "-c", RUN, "scan", topic_name, "--columns", "_offset,n", "--follow",
                                 "--limit", "3", "--url", broker.flight_url], stdout=subprocess.PIPE, text=True)
        try:
            t.append(pa.table({"n": [10, 20]}))
            t.append(pa.table({"n": [30, 40]}))
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    lines = [line.split(" | ") for line in out.splitlines()]
    assert [c.strip() for c in lines[0]] == ["_offset", "n"]
    assert [[c.strip() for c in r] for r in lines[2:]] == [["0", "10"], ["1", "20"], ["2", "30"]]


def test_table_create_primary_key_table(broker, topic_name):
    url = ["--url", broker.flight_url]
    made = fluvial("table", "create", topic_name, "--column", "id:long!", "--column", "v:long!",
                   "--column", "name:string", "--primary-key", "id", "--merge-engine", "versioned",
                   "--version-column", "v", *url)
    assert made.returncode == 0, made.stderr
    with fc.connect(broker.flight_url) as client:
        t = client.table(topic_name)
        t.upsert(pa.table({"id": [1, 2], "v": [5, 1], "name": ["new", "b"]}))
        t.upsert(pa.table({"id": [1], "v": [3], "name": ["stale"]}))  # an older version: no change
        rows = t.lookup(pa.table({"id": [1, 2]}))
    assert sorted(zip(rows.column("id").to_pylist(), rows.column("name").to_pylist())) == [(1, "new"), (2, "b")]
    described = fluvial("table", "describe", topic_name, *url)
    assert "primary" in described.stdout.lower(), described.stdout


def test_table_create_retract_and_aggregation_tables(broker, topic_name):
    url = ["--url", broker.flight_url]
    made = fluvial("table", "create", topic_name, "--column", "id:long!", "--column", "level:long",
                   "--column", "attr:string", "--primary-key", "id", "--merge-engine", "retract",
                   "--upsert-key", "level", "--retract-state-ttl-ms", "60000", *url)
    assert made.returncode == 0, made.stderr
    with fc.connect(broker.flight_url) as client:
        t = client.table(topic_name)
        assert t.info.configs["fluvial.upsert.key"] == "level"
        t.upsert(pa.table({"_change": ["+U", "+I", "-U"], "id": [1, 1, 1], "level": [20, 10, 10],
                           "attr": ["b1", "a1", "a1"]}))
        assert t.lookup(pa.table({"id": [1]})).to_pylist() == [{"id": 1, "level": 20, "attr": "b1"}]
    described = fluvial("table", "describe", topic_name, *url)
    assert "retract state: 1 key(s), 1 live row(s)" in described.stdout, described.stdout

    agg = f"{topic_name}-agg"
    made = fluvial("table", "create", agg, "--column", "k:string!", "--column", "total:long",
                   "--column", "n:long", "--primary-key", "k", "--merge-engine", "aggregation",
                   "--agg", "total=sum", "--agg", "n=count", *url)
    assert made.returncode == 0, made.stderr
    with fc.connect(broker.flight_url) as client:
        t = client.table(agg)
        t.upsert(pa.table({"k": ["a", "a", "b"], "total": [5, 7, 1], "n": [1, 1, 1]}))
        t.upsert(pa.table({"_change": ["-U"], "k": ["a"], "total": [5], "n": [1]}))
        rows = t.lookup(pa.table({"k": ["a", "b"]})).sort_by("k").to_pylist()
    assert rows == [{"k": "a", "total": 7, "n": 1}, {"k": "b", "total": 1, "n": 1}]
    bad = fluvial("table", "create", f"{topic_name}-bad", "--column", "k:string!", "--column", "v:string",
                  "--primary-key", "k", "--merge-engine", "aggregation", "--agg", "v=sum", *url)
    assert bad.returncode != 0 and "needs a numeric column" in bad.stderr
