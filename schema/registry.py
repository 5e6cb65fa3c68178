"""The schema registry: subjects, versions, global schema ids, compatibility, and hooks for the broker."""
from __future__ import annotations

import enum
import functools
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema
import pyarrow as pa

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.arrow_mapping import avro_to_arrow, json_schema_to_arrow
from fluvial.schema.avro_schema import AvroSchema, parse_avro
from fluvial.schema.compatibility import (
    Compatibility, arrow_can_evolve, avro_can_read, check_modes, json_can_read,
)
from fluvial.schema.errors import (
    IncompatibleSchemaError, InvalidCompatibilityLevelError, InvalidSchemaError, InvalidVersionError,
    SchemaNotFoundError, SchemaVersionNotSoftDeletedError, SubjectConfigNotFoundError,
    SubjectNotFoundError, SubjectNotSoftDeletedError, VersionNotFoundError, UnsupportedSchemaError,
    InvalidSubjectError,
)
from fluvial.schema.store import RegistryStore, SubjectVersion

DEFAULT_COMPATIBILITY = Compatibility.BACKWARD


class SchemaType(str, enum.Enum):
    AVRO = "AVRO"
    JSON = "JSON"


@dataclass(eq=False)
class Schema:
    """A parsed schema of either type, as registered (or about to be)."""

    schema_type: SchemaType
    text: str
    canonical: str = field(repr=False)
    avro: AvroSchema | None = field(default=None, repr=False)
    json: Any = field(default=None, repr=False)
    id: int | None = None

    @functools.cached_property
    def arrow_schema(self) -> pa.Schema:
        """The table columns this schema maps to (UnsupportedSchemaError if none)."""
        if self.schema_type is SchemaType.AVRO:
            return avro_to_arrow(self.avro)
        return json_schema_to_arrow(self.json)

    def same_as(self, other: "Schema") -> bool:
        """The same schema, whatever its spelling (whitespace, key order)."""
        return self.schema_type is other.schema_type and self.canonical == other.canonical

    def can_read(self, writer: "Schema") -> list[str]:
        """Problems of reading data written with `writer` using this schema."""
        if writer.schema_type is not self.schema_type:
            return [f"schema type changed from {writer.schema_type.value} to {self.schema_type.value}"]
        if self.schema_type is SchemaType.AVRO:
            return avro_can_read(self.avro.root, writer.avro.root)
        return json_can_read(self.json, writer.json)


# Subject names: what Confluent's registry takes (any text without control characters),
# bounded so that `<topic>-value` of the longest Kafka topic name (249) fits.
MAX_SUBJECT_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_subject(subject: str) -> None:
    """InvalidSubjectError (42208) for a subject name a schema may not be registered under."""
    if not subject or len(subject) > MAX_SUBJECT_LENGTH or _CONTROL.search(subject):
        raise InvalidSubjectError(
            f"The specified subject '{subject[:300]!r}' is not valid: 1 to {MAX_SUBJECT_LENGTH} characters, "
            "no control characters")


def _check_json_refs(doc: Any) -> None:
    """JSON Schema `$ref`s must point inside the schema itself ('#', '#/...'): the registry
    never fetches a URL or a file, and references to other subjects are not supported."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
                raise InvalidSchemaError(
                    f"Invalid JSON schema: $ref {ref!r} points outside the schema; only references inside "
                    "it ('#/definitions/...', '#/$defs/...') are supported")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def parse_schema(text: str, schema_type: str | None = None, references: list | None = None) -> Schema:
    """Parse a schema as sent to the registry; InvalidSchemaError (42201) when it is not valid
    (including schemas nested deeper than the parser's recursion allows)."""
    try:
        return _parse_schema(text, schema_type, references)
    except RecursionError:
        raise InvalidSchemaError("Invalid schema: nested too deeply") from None


def _parse_schema(text: str, schema_type: str | None, references: list | None) -> Schema:
    try:
        st = SchemaType((schema_type or "AVRO").upper())
    except ValueError:
        raise InvalidSchemaError(f"Invalid schema type {schema_type!r}: AVRO and JSON are supported") from None
    if references:
        raise InvalidSchemaError("Schema references are not supported")
    if not isinstance(text, str):
        raise InvalidSchemaError("Invalid schema: 'schema' must be a string")
    if st is SchemaType.AVRO:
        avro = parse_avro(text)
        return Schema(st, text, avro.canonical, avro=avro)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"Invalid JSON schema: {exc}") from None
    if not isinstance(doc, (dict, bool)):
        raise InvalidSchemaError("Invalid JSON schema: a schema is an object or a boolean")
    try:
        jsonschema.validators.validator_for(doc).check_schema(doc)
    except jsonschema.SchemaError as exc:
        raise InvalidSchemaError(f"Invalid JSON schema: {exc.message}") from None
    _check_json_refs(doc)
    return Schema(st, text, json.dumps(doc, sort_keys=True, separators=(",", ":")), json=doc)


@dataclass(frozen=True)
class SchemaRegistered:
    """What listeners hear after a new subject version is stored."""

    subject: str
    version: int
    schema_id: int
    schema: Schema

    @property
    def topic(self) -> str | None:
        """The topic whose value schema this is (TopicNameStrategy), if the subject is `<topic>-value`."""
        return self.subject[: -len("-value")] if self.subject.endswith("-value") else None


Listener = Callable[[SchemaRegistered], None]
# A validator sees (subject, new schema, latest registered schema or None) and raises
# IncompatibleSchemaError to refuse the registration.
Validator = Callable[[str, Schema, "Schema | None"], None]


@dataclass
class SchemaRegistry:
    """The registry over the broker's metadata store. Thread-safe; methods may block on SQLite."""

    metadata: MetadataStore
    listeners: list[Listener] = field(default_factory=list)
    validators: list[Validator] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = RegistryStore(self.metadata)
        self._schemas: dict[int, Schema] = {}
        self._lock = threading.RLock()
        self.generation = 0  # bumped on every change of subjects, so codecs can refresh

    # ------------------------------------------------------------ schemas
    def schema(self, schema_id: int) -> Schema:
        """The schema with this global id (SchemaNotFoundError, 40403, if none)."""
        s = self._schemas.get(schema_id)
        if s is None:
            row = self.store.schema_by_id(int(schema_id))
            if row is None:
                raise SchemaNotFoundError(f"Schema {schema_id} not found")
            s = parse_schema(row.text, row.schema_type)
            s.id = row.id
            self._schemas[schema_id] = s
        return s

    def schema_versions(self, schema_id: int) -> list[SubjectVersion]:
        self.schema(schema_id)
        return self.store.versions_of_schema(schema_id)

    # ------------------------------------------------------------ subjects
    def subjects(self, include_deleted: bool = False) -> list[str]:
        return self.store.subjects(include_deleted)

    def versions(self, subject: str, include_deleted: bool = False) -> list[SubjectVersion]:
        vs = self.store.versions(subject, include_deleted)
        if not vs:
            raise SubjectNotFoundError(f"Subject '{subject}' not found.")
        return vs

    def version(self, subject: str, version: str | int, include_deleted: bool = False) -> SubjectVersion:
        """A version by number, or "latest" / -1."""
        v = _parse_version(version)
        vs = self.versions(subject, include_deleted)
        if v == -1:
            live = [x for x in vs if not x.deleted] or vs
            return live[-1]
        for x in vs:
            if x.version == v:
                return x
        raise VersionNotFoundError(f"Version {v} not found.")

    def latest(self, subject: str) -> tuple[SubjectVersion, Schema] | None:
        vs = self.store.versions(subject)
        if not vs:
            return None
        return vs[-1], self.schema(vs[-1].schema_id)

    def lookup(self, subject: str, schema: Schema, include_deleted: bool = False) -> SubjectVersion:
        """The version of `subject` holding this schema (POST /subjects/{subject})."""
        vs = self.versions(subject, include_deleted)
        for x in vs:
            if self.schema(x.schema_id).same_as(schema):
                return x
        raise SchemaNotFoundError("Schema not found")

    def register(self, subject: str, schema: Schema) -> tuple[int, int]:
        """Register under `subject`; returns (schema id, version). An identical schema already
        live under the subject returns its id without a new version."""
        check_subject(subject)
        with self._lock:
            live = self.store.versions(subject)
            for x in live:
                if self.schema(x.schema_id).same_as(schema):
                    return x.schema_id, x.version
            previous = [self.schema(x.schema_id) for x in live]
            problems = check_modes(self.compatibility(subject), schema, previous, lambda r, w: r.can_read(w))
            if problems:
                raise IncompatibleSchemaError(
                    "Schema being registered is incompatible with an earlier schema for subject "
                    f"\"{subject}\", details: {problems}")
            for validate in self.validators:
                validate(subject, schema, previous[-1] if previous else None)
            schema_id, version = self.store.add_version(subject, schema.schema_type.value, schema.text, schema.canonical)
            self.generation += 1
        stored = self.schema(schema_id)
        event = SchemaRegistered(subject, version, schema_id, stored)
        for listener in list(self.listeners):
            listener(event)
        return schema_id, version

    def test_compatibility(self, subject: str, schema: Schema, version: str | int | None) -> list[str]:
        """Problems of `schema` against one version (or all that the mode checks, when None)."""
        if version is None:
            previous = [self.schema(x.schema_id) for x in self.store.versions(subject)]
            mode = self.compatibility(subject)
        else:
            x = self.version(subject, version)
            previous = [self.schema(x.schema_id)]
            mode = Compatibility(self.compatibility(subject).value.replace("_TRANSITIVE", ""))
        return check_modes(mode, schema, previous, lambda r, w: r.can_read(w))

    def delete_version(self, subject: str, version: str | int, permanent: bool = False) -> int:
        with self._lock:
            x = self.version(subject, version, include_deleted=permanent)
            if permanent:
                if not x.deleted:
                    raise SchemaVersionNotSoftDeletedError(
                        f"Subject '{subject}' Version {x.version} was not deleted first before being permanently deleted")
                self.store.hard_delete(subject, [x.version])
            else:
                if x.deleted:
                    raise VersionNotFoundError(f"Version {x.version} not found.")
                self.store.soft_delete(subject, [x.version])
            self.generation += 1
            return x.version

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        with self._lock:
            all_versions = self.store.versions(subject, include_deleted=True)
            if not all_versions:
                raise SubjectNotFoundError(f"Subject '{subject}' not found.")
            live = [x.version for x in all_versions if not x.deleted]
            if permanent:
                if live:
                    raise SubjectNotSoftDeletedError(
                        f"Subject '{subject}' was not deleted first before being permanently deleted")
                deleted = [x.version for x in all_versions]
                self.store.hard_delete(subject, deleted)
            else:
                if not live:
                    raise SubjectNotFoundError(f"Subject '{subject}' not found.")
                deleted = live
                self.store.soft_delete(subject, live)
            self.generation += 1
            return deleted

    # ------------------------------------------------------------ config
    def compatibility(self, subject: str | None = None) -> Compatibility:
        """The level that applies to `subject` (its own, else the global one)."""
        level = self.store.compatibility(subject) if subject else None
        level = level or self.store.compatibility("")
        return Compatibility(level) if level else DEFAULT_COMPATIBILITY

    def subject_compatibility(self, subject: str) -> Compatibility:
        level = self.store.compatibility(subject)
        if level is None:
            raise SubjectConfigNotFoundError(f"Subject '{subject}' does not have subject-level compatibility configured")
        return Compatibility(level)

    def set_compatibility(self, level: str, subject: str | None = None) -> Compatibility:
        try:
            c = Compatibility(str(level).upper())
        except ValueError:
            raise InvalidCompatibilityLevelError(f"Invalid compatibility level. Valid values are none, backward, "
                                                 "forward, full, backward_transitive, forward_transitive, "
                                                 "and full_transitive") from None
        self.store.set_compatibility(subject or "", c.value)
        return c

    def delete_compatibility(self, subject: str | None = None) -> Compatibility:
        previous = self.compatibility(subject)
        self.store.delete_compatibility(subject or "")
        return previous

    # ------------------------------------------------------------ tables
    def subject_ids(self, subject: str) -> list[int]:
        """Schema ids of the live versions of `subject`, oldest first."""
        return [x.schema_id for x in self.store.versions(subject)]


def _parse_version(version: str | int) -> int:
    if isinstance(version, str):
        if version == "latest":
            return -1
        try:
            version = int(version)
        except ValueError:
            raise InvalidVersionError(
                f"The specified version '{version}' is not a valid version id. Allowed values are between "
                "[1, 2^31-1] and the string \"latest\"") from None
    if version == -1:
        return -1
    if not 1 <= version < 2 ** 31:
        raise InvalidVersionError(
            f"The specified version '{version}' is not a valid version id. Allowed values are between "
            "[1, 2^31-1] and the string \"latest\"")
    return version


def table_validator(is_table_subject: Callable[[str], bool]) -> Validator:
    """A validator refusing, for subjects of typed tables, schemas that have no column mapping
    or whose columns cannot be read from the batches stored under the previous version."""

    def validate(subject: str, new: Schema, previous: Schema | None) -> None:
        if not is_table_subject(subject):
            return
        try:
            new_cols = new.arrow_schema
        except UnsupportedSchemaError as exc:
            raise IncompatibleSchemaError(f"Schema cannot be a table schema: {exc}") from None
        if previous is not None:
            problems = arrow_can_evolve(previous.arrow_schema, new_cols)
            if problems:
                raise IncompatibleSchemaError(f"Table columns cannot evolve to this schema: {problems}")

    return validate
