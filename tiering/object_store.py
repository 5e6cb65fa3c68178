"""Object stores: where tiered data (remote log segments, KV snapshots) lives.

One small interface with two implementations:

- `LocalObjectStore`: a folder (``file:///abs/path`` or a plain path), the embedded default;
- `S3ObjectStore`: an S3 bucket and key prefix through boto3 (``s3://bucket/prefix``), for AWS
  or any S3-compatible server (MinIO, moto_server, ...).

Keys are ``/``-separated relative names. Every call blocks (network or disk): the broker runs
them on executors, never on the event loop.
"""
from __future__ import annotations

import io
import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa

from fluvial.errors import InvalidConfigError, ObjectNotFound, ObjectStoreError

# Options that may be shown to clients (they say where the store is, not how to get in).
PUBLIC_OPTIONS = ("endpoint_url", "region")
_KNOWN_OPTIONS = {"endpoint_url", "region", "access_key_id", "secret_access_key", "session_token",
                  "connect_timeout", "read_timeout", "max_attempts"}


@dataclass
class StoreStats:
    """Counters of what a store moved; benchmarks and tests read them."""

    gets: int = 0
    bytes_read: int = 0
    puts: int = 0
    bytes_written: int = 0

    def reset(self) -> None:
        self.gets = self.bytes_read = self.puts = self.bytes_written = 0


class ObjectStore(ABC):
    """Put, ranged get, list, delete and atomic replace of whole objects."""

    url: str
    options: dict[str, str]

    def __init__(self) -> None:
        self.stats = StoreStats()
        self._stats_lock = threading.Lock()

    def _count_read(self, n: int) -> None:
        with self._stats_lock:
            self.stats.gets += 1
            self.stats.bytes_read += n

    def _count_write(self, n: int) -> None:
        with self._stats_lock:
            self.stats.puts += 1
            self.stats.bytes_written += n

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write a whole object; readers see the old object or the new one, never a part."""

    @abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file as one object."""

    @abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an object (``end`` None: to its end). Raises ObjectNotFound."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's length in bytes. Raises ObjectNotFound."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Remove objects; keys that do not exist are fine."""

    def replace(self, key: str, data: bytes) -> None:
        """Atomically replace a whole object (manifests): ``put`` is atomic in both stores."""
        self.put(key, data)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except ObjectNotFound:
            return False

    def open_input(self, key: str, size: int | None = None) -> pa.NativeFile:
        """A random-access file over the object; every read is a ranged get (for Parquet footers
        and column chunks). ``size``, when the caller knows it, saves asking the store."""
        return pa.PythonFile(_RangedReader(self, key, self.size(key) if size is None else size), mode="r")

    def public_description(self) -> dict:
        """What a client needs to find the store: the URL and the non-secret options."""
        return {"url": self.url, "options": {k: v for k, v in self.options.items() if k in PUBLIC_OPTIONS}}

    def close(self) -> None:
        pass


class _RangedReader(io.RawIOBase):
    """A seekable read-only file whose reads are ranged gets of one object."""

    def __init__(self, store: ObjectStore, key: str, length: int):
        self._store = store
        self._key = key
        self._length = length
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._position = offset
        elif whence == io.SEEK_CUR:
            self._position += offset
        elif whence == io.SEEK_END:
            self._position = self._length + offset
        else:
            raise ValueError(f"bad whence {whence}")
        return self._position

    def size(self) -> int:
        return self._length

    def read(self, n: int = -1) -> bytes:
        start = self._position
        end = self._length if n is None or n < 0 else min(self._length, start + n)
        if end <= start:
            return b""
        data = self._store.get(self._key, start, end)
        self._position = start + len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}")
    return key


class LocalObjectStore(ObjectStore):
    """Objects as files under a root folder; writes go to a temporary file, fsynced, then renamed."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()
        self.options = {}

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _write(self, key: str, chunks: Iterable[bytes]) -> int:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        written = 0
        try:
            with open(temporary, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    written += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
            directory = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ObjectStoreError(f"cannot write {key} to {self.url}: {exc}") from exc
        self._count_write(written)
        return written

    def put(self, key: str, data: bytes) -> None:
        self._write(key, [data])

    def put_file(self, key: str, path: Path) -> None:
        def chunks():
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk
        self._write(key, chunks())

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(-1 if end is None else max(0, end - start))
        except FileNotFoundError:
            raise ObjectNotFound(f"object {key} not found in {self.url}") from None
        except OSError as exc:
            raise ObjectStoreError(f"cannot read {key} from {self.url}: {exc}") from exc
        self._count_read(len(data))
        return data

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFound(f"object {key} not found in {self.url}") from None

    def list(self, prefix: str) -> list[str]:
        # Walk only the folder the prefix names, not the whole store.
        folder = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not folder.is_dir():
            return []
        keys = []
        for dirpath, _, filenames in os.walk(folder):
            for name in filenames:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # a write in progress (or a crashed one): not an object
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ObjectStoreError(f"cannot delete {key} from {self.url}: {exc}") from exc

    def open_input(self, key: str, size: int | None = None) -> pa.NativeFile:
        path = self._path(key)
        try:
            return _counting_file(self, pa.OSFile(str(path), "r"))
        except FileNotFoundError:
            raise ObjectNotFound(f"object {key} not found in {self.url}") from None


def _counting_file(store: ObjectStore, file: pa.NativeFile) -> pa.NativeFile:
    """A local file whose reads count in the store's statistics, like ranged gets do."""

    class _Reader(io.RawIOBase):
        def readable(self):
            return True

        def seekable(self):
            return True

        def tell(self):
            return file.tell()

        def seek(self, offset, whence=io.SEEK_SET):
            return file.seek(offset, whence)

        def size(self):
            return file.size()

        def read(self, n=-1):
            data = file.read(None if n is None or n < 0 else n)
            store._count_read(len(data))
            return data

        def readinto(self, buffer):
            data = self.read(len(buffer))
            buffer[: len(data)] = data
            return len(data)

        def close(self):
            file.close()
            super().close()

    return pa.PythonFile(_Reader(), mode="r")


class S3ObjectStore(ObjectStore):
    """Objects in an S3 bucket under a key prefix, through boto3."""

    def __init__(self, bucket: str, prefix: str, options: dict[str, str] | None = None):
        super().__init__()
        import boto3
        from botocore.config import Config

        options = dict(options or {})
        unknown = set(options) - _KNOWN_OPTIONS
        if unknown:
            raise InvalidConfigError(f"unknown object store option(s) {sorted(unknown)}; known: {sorted(_KNOWN_OPTIONS)}")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.options = options
        # Short timeouts and few retries: the remote log manager retries with its own
        # backoff, and a store that is down must be noticed quickly, not waited on.
        config = Config(
            connect_timeout=float(options.get("connect_timeout", 3)),
            read_timeout=float(options.get("read_timeout", 30)),
            retries={"max_attempts": int(options.get("max_attempts", 2)), "mode": "standard"},
            max_pool_connections=16,
        )
        session = boto3.session.Session()
        self._client = session.client(
            "s3",
            endpoint_url=options.get("endpoint_url"),
            region_name=options.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1",
            aws_access_key_id=options.get("access_key_id"),
            aws_secret_access_key=options.get("secret_access_key"),
            aws_session_token=options.get("session_token"),
            config=config,
        )

    def _key(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def _fail(self, action: str, key: str, exc: Exception) -> Exception:
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"object {key} not found in {self.url}")
            return ObjectStoreError(f"cannot {action} {key} in {self.url}: {code} {exc}")
        return ObjectStoreError(f"cannot {action} {key} in {self.url}: {exc}")

    def put(self, key: str, data: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:  # noqa: BLE001 - botocore raises many kinds; all mean "not stored"
            raise self._fail("write", key, exc) from exc
        self._count_write(len(data))

    def put_file(self, key: str, path: Path) -> None:
        try:
            # upload_file switches to a multipart upload for large files; S3 makes the object
            # visible only when the upload completes.
            self._client.upload_file(str(path), self.bucket, self._key(key))
        except Exception as exc:  # noqa: BLE001
            raise self._fail("upload", key, exc) from exc
        self._count_write(Path(path).stat().st_size)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""
        kwargs = {}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key), **kwargs)
            data = response["Body"].read()
        except Exception as exc:  # noqa: BLE001
            from botocore.exceptions import ClientError

            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # a range starting at or past the end, as a file read would give
            raise self._fail("read", key, exc) from exc
        self._count_read(len(data))
        return data

    def size(self, key: str) -> int:
        try:
            return int(self._client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except Exception as exc:  # noqa: BLE001
            raise self._fail("stat", key, exc) from exc

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(item["Key"][len(self.prefix):] for item in page.get("Contents", ()))
        except Exception as exc:  # noqa: BLE001
            raise self._fail("list", prefix, exc) from exc
        return sorted(keys)

    def delete(self, keys: Iterable[str]) -> None:
        keys = [self._key(k) for k in keys]
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = keys[i : i + 1000]
            try:
                response = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
            except Exception as exc:  # noqa: BLE001
                raise self._fail("delete", chunk[0], exc) from exc
            errors = [e for e in response.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
            if errors:
                raise ObjectStoreError(f"cannot delete {errors[0].get('Key')} in {self.url}: {errors[0].get('Message')}")

    def close(self) -> None:
        self._client.close()


def open_object_store(url: str, options: dict[str, str] | None = None) -> ObjectStore:
    """``file:///abs/path`` or a plain path -> a local folder; ``s3://bucket/prefix`` -> S3.

    S3 options: endpoint_url, region, access_key_id, secret_access_key, session_token
    (without keys, boto3's usual sources: AWS_* environment variables, profiles, instance roles).
    """
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise InvalidConfigError(f"object store URL {url!r} names no bucket (s3://bucket/prefix)")
        return S3ObjectStore(parsed.netloc, parsed.path, options)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidConfigError(f"object store URL {url!r}: file URLs name a local path (file:///abs/path)")
        if options:
            raise InvalidConfigError(f"a local object store takes no options, got {sorted(options)}")
        return LocalObjectStore(Path(unquote(parsed.path)))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        if options:
            raise InvalidConfigError(f"a local object store takes no options, got {sorted(options)}")
        return LocalObjectStore(Path(url))
    raise InvalidConfigError(f"unsupported object store URL {url!r}: use file:///path or s3://bucket/prefix")
