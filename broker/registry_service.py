"""Serves the schema registry over HTTP and keeps each table's value format in step with it.

A table is typed (Avro or JSON values stored as typed Arrow columns) when it is created
with `fluvial.value.format` avro/json (and `fluvial.value.schema`, registered under
`<table>-value`), or when a schema is registered under `<table>-value`. Typed tables
follow the subject's latest version: the codecs refresh themselves when the registry
changes, so evolution needs no step here.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from fluvial.broker import http_security
from fluvial.broker.broker import configure_http_app, on_start, on_stop
from fluvial.broker.kafka_batches import RAW
from fluvial.errors import InvalidConfigError
from fluvial.schema.codecs import AvroValueCodec, JsonValueCodec
from fluvial.schema.errors import RegistryError as SchemaError
from fluvial.schema.registry import SchemaRegistered, SchemaRegistry, SchemaType, parse_schema, table_validator
from fluvial.schema.rest import start_http
from fluvial.schema.value_format import TypedValueFormat

log = logging.getLogger(__name__)

FORMAT = "fluvial.value.format"
SCHEMA = "fluvial.value.schema"


# The schema language `fluvial.value.schema` is written in, by value format.
SCHEMA_LANGUAGE = {"avro": "AVRO", "json": "JSON"}
SCHEMA_LANGUAGE_NAME = {"avro": "an Avro schema", "json": "a JSON Schema"}


def _other_language_hint(text: str, fmt: str) -> str:
    """A pointer to the right format when the schema is valid in the other format's language."""
    for other, language in SCHEMA_LANGUAGE.items():
        if other == fmt:
            continue
        try:
            parse_schema(text, language).arrow_schema  # noqa: B018
        except (SchemaError, ValueError):
            continue
        return f" (it is {SCHEMA_LANGUAGE_NAME[other]}: use {FORMAT}={other} for it)"
    return ""


def subject_of(table_name: str) -> str:
    return f"{table_name}-value"


class TableSchemas:
    """Attaches value formats to tables, and registers the schemas tables are created with."""

    def __init__(self, registry: SchemaRegistry, tables):
        self.registry = registry
        self.tables = tables

    def format_for(self, name: str, configs: dict[str, str]):
        fmt = configs.get(FORMAT)
        latest = self.registry.latest(subject_of(name))
        if latest is None:
            return RAW
        if fmt is None:
            fmt = "avro" if latest[1].schema_type is SchemaType.AVRO else "json"
        if fmt == "raw":
            return RAW
        codec_cls = AvroValueCodec if fmt == "avro" else JsonValueCodec
        return TypedValueFormat(codec_cls(self.registry, subject_of(name)))

    def before_create(self, name: str, configs: dict[str, str], validate_only: bool) -> Callable[[], None] | None:
        """Check the format/schema configs; register the schema (unless only validating).
        Returns what unregisters it again, when it was registered here."""
        fmt = configs.get(FORMAT, "raw")
        text = configs.get(SCHEMA)
        if fmt == "raw":
            if text:
                raise InvalidConfigError(f"{SCHEMA} needs {FORMAT} avro or json")
            return
        if not text:
            if self.registry.latest(subject_of(name)) is None:
                raise InvalidConfigError(
                    f"{FORMAT}={fmt} needs a schema: set {SCHEMA} or register one under {subject_of(name)}")
            return
        language = SCHEMA_LANGUAGE[fmt]
        try:
            schema = parse_schema(text, language)
            schema.arrow_schema  # noqa: B018 - the mapping must exist for a typed table
        except (SchemaError, ValueError) as exc:
            hint = _other_language_hint(text, fmt)
            raise InvalidConfigError(f"Invalid {SCHEMA} for {FORMAT}={fmt} (which takes {SCHEMA_LANGUAGE_NAME[fmt]})"
                                     f": {exc}{hint}") from None
        if not validate_only:
            subject = subject_of(name)
            known = {x.version for x in self.registry.store.versions(subject, include_deleted=True)}
            try:
                _, version = self.registry.register(subject, schema)
            except SchemaError as exc:
                raise InvalidConfigError(f"{SCHEMA} cannot be registered under {subject}: {exc}") from None
            if version not in known:
                # A creation that fails later takes this registration back, so that a
                # refused table leaves no schema that would type a later table of its name.
                return lambda: self._unregister(subject, version)
        return None

    def _unregister(self, subject: str, version: int) -> None:
        self.registry.delete_version(subject, version)
        self.registry.delete_version(subject, version, permanent=True)

    def attach(self, table) -> None:
        table.value_format = self.format_for(table.name, table.configs)

    def is_typed_table_subject(self, subject: str) -> bool:
        """A subject whose versions become the columns of an existing typed table."""
        if not subject.endswith("-value"):
            return False
        table = self.tables.tables.get(subject[: -len("-value")])
        return table is not None and table.value_format is not RAW

    def on_registered(self, event: SchemaRegistered) -> None:
        table = self.tables.tables.get(event.topic) if event.topic else None
        if table is not None and table.value_format is RAW and table.configs.get(FORMAT, "") != "raw":
            self.attach(table)
            log.info("table %s is now typed (%s)", table.name, table.value_format.name)


def on_loop(loop: asyncio.AbstractEventLoop, listener: Callable[[SchemaRegistered], None]
            ) -> Callable[[SchemaRegistered], None]:
    """A registry listener that runs on the event loop, whichever thread registered.

    Registrations run on worker threads (the REST handlers, table creation), while tables
    and their value formats belong to the loop. `call_soon_threadsafe` queues the listener
    ahead of the registering thread's own completion, so by the time the client is answered
    the table has already changed.
    """
    def deliver(event: SchemaRegistered) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            listener(event)
            return
        try:
            loop.call_soon_threadsafe(listener, event)
        except RuntimeError:  # the loop is closed: the broker is shutting down, nothing to update
            log.debug("registry event for %s after the event loop closed", event.subject)
    return deliver


@on_start
async def start_registry(broker) -> None:
    registry = SchemaRegistry(broker.store)
    schemas = TableSchemas(registry, broker.tables)
    for table in broker.tables.tables.values():
        schemas.attach(table)
    broker.tables.create_hooks.append(schemas.before_create)
    broker.tables.open_hooks.append(schemas.attach)
    registry.listeners.append(on_loop(asyncio.get_running_loop(), schemas.on_registered))
    # A new version that the table's stored columns cannot evolve to is refused (HTTP 409).
    registry.validators.append(table_validator(schemas.is_typed_table_subject))
    broker.extensions["registry"] = registry
    broker.extensions["table_schemas"] = schemas
    def configure(app) -> None:
        configure_http_app(broker, app)
        http_security.install(broker, app)

    runner = await start_http(registry, broker.config.host, broker.config.http_port, configure=configure,
                              ssl_context=http_security.ssl_context(broker))
    broker.extensions["registry_http"] = runner
    broker.ports["http_port"] = runner.addresses[0][1]
    log.info("HTTP port (schema registry, console, metrics) listening on %s://%s:%d (authentication: %s)",
             "https" if broker.config.security.http_tls else "http", broker.config.host, broker.ports["http_port"],
             broker.config.security.http_auth)


@on_stop
async def stop_registry(broker) -> None:
    runner = broker.extensions.get("registry_http")
    if runner is not None:
        await asyncio.wait_for(runner.cleanup(), 10)
