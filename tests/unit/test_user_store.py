"""The user store: credentials only (never a password), durable, thread-safe verification."""
import json
import threading

from fluvial.security import scram
from fluvial.security.users import UserStore


def test_users_are_stored_hashed_and_survive_reopen(tmp_path):
    store = UserStore.in_data_dir(tmp_path)
    store.set_password("alice", "correct horse")
    assert store.verify_password("alice", "correct horse")
    assert not store.verify_password("alice", "wrong")
    assert not store.verify_password("bob", "correct horse")
    text = (tmp_path / "users.json").read_text()
    assert "correct horse" not in text
    doc = json.loads(text)
    assert set(doc["users"]["alice"]) == set(scram.MECHANISMS)
    assert all(c["iterations"] >= 4096 for c in doc["users"]["alice"].values())
    again = UserStore.in_data_dir(tmp_path)
    assert again.verify_password("alice", "correct horse")
    assert again.delete_user("alice") and not again.delete_user("alice")
    assert not UserStore.in_data_dir(tmp_path).verify_password("alice", "correct horse")
    assert not list(tmp_path.glob("*.tmp"))


def test_one_mechanism_is_enough_and_change_invalidates_cache(tmp_path):
    store = UserStore.in_data_dir(tmp_path)
    store.apply(upserts=[("u", scram.credential_from_password("SCRAM-SHA-512", "one", iterations=4096))])
    assert store.verify_password("u", "one")
    assert store.verify_password("u", "one")  # cached
    store.apply(upserts=[("u", scram.credential_from_password("SCRAM-SHA-512", "two", iterations=4096))])
    assert not store.verify_password("u", "one")
    assert store.verify_password("u", "two")
    store.apply(deletions=[("u", "SCRAM-SHA-512")])
    assert "u" not in store and not store.verify_password("u", "two")


def test_bootstrap_does_not_rewrite_when_unchanged(tmp_path):
    store = UserStore.in_data_dir(tmp_path)
    store.bootstrap({"admin": "pw"})
    mtime = (tmp_path / "users.json").stat().st_mtime_ns
    UserStore.in_data_dir(tmp_path).bootstrap({"admin": "pw"})
    assert (tmp_path / "users.json").stat().st_mtime_ns == mtime
    s2 = UserStore.in_data_dir(tmp_path)
    s2.bootstrap({"admin": "new"})
    assert s2.verify_password("admin", "new") and not s2.verify_password("admin", "pw")


def test_concurrent_verification(tmp_path):
    store = UserStore.in_data_dir(tmp_path)
    store.set_password("a", "pa")
    results = []

    def worker(i):
        results.append(store.verify_password("a", "pa" if i % 2 == 0 else "nope") == (i % 2 == 0))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results) and len(results) == 16
