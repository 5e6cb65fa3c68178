"""The web console in a real browser: headless Chromium driven by Selenium.

Every page loads without browser console errors; the row browser shows the rows a Kafka
producer wrote (projected and filtered); the group page shows lag falling to 0 once the
consumer has read everything; schema diffs and primary-key lookups show what was
written. Screenshots of each page go to test-artifacts/console/ (or
$FLUVIAL_TEST_ARTIFACTS/console/).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from fluvial.client import connect

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402

ARTIFACTS = Path(os.environ.get("FLUVIAL_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
ORDER_SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("city", pa.string()),
                          pa.field("amount", pa.float64())])
CITIES = ["Oslo", "Lima", "Pune", "Kobe"]


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    found = _chromium()
    if found is None:
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them with apt-get)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    options.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


class Console:
    def __init__(self, driver, base: str, shots: Path):
        self.driver = driver
        self.base = base
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    def open(self, path: str, shot: str, *, expect_error: bool = False) -> None:
        self.driver.get_log("browser")  # drop what earlier pages logged
        self.driver.get(self.base + path)
        self.driver.find_element(By.TAG_NAME, "main")
        self.driver.save_screenshot(str(self.shots / f"{shot}.png"))
        page = self.driver.page_source
        assert "Traceback" not in page
        errors = [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]
        if expect_error:
            # The page's own status is the one error the browser reports.
            errors = [e for e in errors if "the server responded with a status of 4" not in e["message"]]
        assert errors == [], f"browser console errors on {path}: {errors}"

    def texts(self, css: str) -> list[str]:
        # Read in one script: pages refresh parts of themselves, and elements found one call
        # earlier may be gone by the next.
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent.trim());", css)

    def table(self, css: str) -> list[dict[str, str]]:
        return self.driver.execute_script("""
            const t = document.querySelector(arguments[0]);
            if (!t) { return []; }
            const heads = Array.from(t.querySelectorAll('thead th')).map(e => e.textContent.trim());
            return Array.from(t.querySelectorAll('tbody tr')).map(r => Object.fromEntries(
                Array.from(r.querySelectorAll('td')).map((td, i) => [heads[i], td.textContent.trim()])));
        """, css)


def _register(url: str, subject: str, schema: dict) -> None:
    body = json.dumps({"schema": json.dumps(schema)}).encode()
    req = urllib.request.Request(f"{url}/subjects/{subject}/versions", data=body, method="POST",
                                 headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_console_pages_in_a_real_browser(browser, fresh_broker, topic_name, request):
    b = fresh_broker("--metrics-sample-interval-ms", "300", "--group-initial-rebalance-delay-ms", "0")
    console = Console(browser, f"{b.http_url}/console", ARTIFACTS / "console" / request.node.name)
    orders = topic_name
    with connect(b.flight_url) as client:
        client.create_table(orders, ORDER_SCHEMA, buckets=2, kafka_format="json")
        users = client.create_table(f"{orders}-users", pa.schema([pa.field("user", pa.string(), False),
                                                                  pa.field("visits", pa.int64())]),
                                    primary_key=["user"])
        users.upsert(pa.table({"user": ["ann", "bob"], "visits": pa.array([3, 7], pa.int64())}))

    # A Kafka producer writes 120 orders as JSON values.
    written = [{"id": i, "city": CITIES[i % 4], "amount": float(i)} for i in range(120)]
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for row in written:
        p.produce(orders, key=str(row["id"]).encode(), value=json.dumps(row).encode(), partition=row["id"] % 2)
    assert p.flush(30) == 0

    # Two versions of a subject: the diff shows the added field.
    v1 = {"type": "record", "name": "Pay", "fields": [{"name": "id", "type": "long"}]}
    v2 = {"type": "record", "name": "Pay", "fields": [{"name": "id", "type": "long"},
                                                       {"name": "note", "type": "string", "default": ""}]}
    _register(b.http_url, "payments-value", v1)
    _register(b.http_url, "payments-value", v2)

    # The group has committed 40 of bucket 0 and nothing of bucket 1.
    setup = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "console-group", "enable.auto.commit": False})
    setup.commit(offsets=[TopicPartition(orders, 0, 40), TopicPartition(orders, 1, 0)], asynchronous=False)
    setup.close()

    console.open("/", "overview")
    assert "Healthy" in browser.find_element(By.ID, "health").text
    time.sleep(1.0)  # a few history samples for the charts
    console.open("/", "overview-charts")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-records svg polyline")

    console.open("/tables", "tables")
    listed = {r["Name"]: r for r in console.table("#tables")}
    assert listed[orders]["Records"] == "120" and listed[orders]["Buckets"] == "2"
    assert listed[f"{orders}-users"]["Kind"] == "primary-key"

    console.open(f"/tables/{orders}", "table")
    assert [r["Column"] for r in console.table("#schema")] == ["id", "city", "amount"]
    assert [(r["Bucket"], r["High watermark"]) for r in console.table("#buckets")] == [("0", "60"), ("1", "60")]
    assert any(r["Name"] == "retention.ms" for r in console.table("#configs"))

    # The row browser: two columns, a filter, the newest rows.
    browser.find_element(By.ID, "browse-rows").click()
    console.open(f"/tables/{orders}/rows?col=id&col=city&where=amount+%3E%3D+100&limit=500", "rows-filtered")
    shown = console.table("#row-table")
    assert sorted(int(r["id"]) for r in shown) == list(range(100, 120))
    assert all(r["city"] == CITIES[int(r["id"]) % 4] for r in shown)
    assert set(shown[0]) == {"_bucket", "_offset", "_timestamp", "id", "city"}
    console.open(f"/tables/{orders}/rows?start=earliest&bucket=1&limit=5", "rows-earliest")
    assert [int(r["id"]) for r in console.table("#row-table")] == [1, 3, 5, 7, 9]

    # Live tail: rows produced while the page is open appear without reloading it.
    console.open(f"/tables/{orders}/rows?col=id&col=city&limit=5&live=1", "rows-live-before")
    for i in range(120, 123):
        p.produce(orders, value=json.dumps({"id": i, "city": "Rome", "amount": 1.0}).encode(), partition=0)
    assert p.flush(30) == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ids = [r.get("id") for r in console.table("#row-table")]
        if "122" in ids:
            break
        time.sleep(0.3)
    assert {"120", "121", "122"} <= set(ids)
    browser.save_screenshot(str(console.shots / "rows-live-after.png"))

    console.open(f"/tables/{orders}-users/lookup?user=bob", "lookup")
    assert console.table("#lookup-result") == [{"user": "bob", "visits": "7"}]
    console.open(f"/tables/{orders}-users/lookup?user=nobody", "lookup-none")
    assert browser.find_element(By.ID, "lookup-none").is_displayed()
    console.open(f"/tables/{orders}-users", "pk-table")
    assert sum(int(r["Applied offset"]) for r in console.table("#kv")) == 2

    console.open("/schemas", "schemas")
    assert {r["Subject"]: r["Versions"] for r in console.table("#subjects")}["payments-value"] == "2"
    console.open("/schemas/payments-value", "subject-diff")
    added = console.texts("#diff .add")
    assert any('"name": "note"' in line for line in added)

    console.open("/groups", "groups")
    group_row = {r["Group"]: r for r in console.table("#groups")}["console-group"]
    assert group_row["Lag (records)"] == "83"  # bucket 0: 63 - 40, bucket 1: 60 - 0
    console.open("/groups/console-group", "group-lagging")
    assert browser.find_element(By.ID, "total-lag").get_attribute("data-lag") == "83"

    # A member joins and reads from the committed offsets: the page shows it and its partitions.
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "console-group", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": "console-test-consumer"})
    c.subscribe([orders])
    got = 0
    deadline = time.monotonic() + 60
    while got == 0 and time.monotonic() < deadline:
        m = c.poll(0.5)
        got += m is not None and m.error() is None
    console.open("/groups/console-group", "group-member")
    members = console.table("#members")
    assert len(members) == 1 and members[0]["Client id"] == "console-test-consumer"
    assert members[0]["Assigned"] == f"{orders}-0, {orders}-1"
    assert browser.find_element(By.ID, "group-state").text == "Stable"

    # It reads everything and commits: the group page shows the lag falling to 0.
    while got < 83 and time.monotonic() < deadline:  # from the committed offsets 40 and 0
        m = c.poll(0.5)
        got += m is not None and m.error() is None
    assert got == 83
    c.commit(asynchronous=False)
    lags = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        console.open("/groups/console-group", "group-caught-up")
        lags.append(int(browser.find_element(By.ID, "total-lag").get_attribute("data-lag")))
        if lags[-1] == 0:
            break
        time.sleep(0.5)
    assert lags[-1] == 0
    assert [r["Lag"] for r in console.table("#partitions")] == ["0", "0"]
    c.close()
    time.sleep(1.0)
    console.open("/groups/console-group", "group-chart")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-group svg polyline")

    console.open("/tiering", "tiering")

    # Bad input: clear error pages, never a stack trace.
    for path, status, words in ((f"/tables/{orders}x", "404", "no table"),
                                (f"/tables/{orders}/rows?where=amount+%3E%3E+1", "400", "does not fit column 'amount'"),
                                (f"/tables/{orders}/rows?where=amount", "400", "must look like"),
                                (f"/tables/{orders}/rows?col=nope", "400", "has no column 'nope'"),
                                (f"/tables/{orders}/rows?limit=100000000", "400", "between 1 and 1000"),
                                ("/groups/none-such", "404", "no consumer group")):
        console.open(path, f"error-{status}-{path.split('/')[-1][:20]}", expect_error=True)
        assert browser.find_element(By.CSS_SELECTOR, ".error-title").text.startswith(status)
        assert words in browser.find_element(By.ID, "error-message").text
