"""The Confluent Schema Registry REST subset, served with aiohttp in the broker's event loop."""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any, Awaitable, Callable

from aiohttp import web

from fluvial.schema.errors import InvalidSchemaError, RegistryError, SchemaNotFoundError
from fluvial.schema.registry import Schema, SchemaRegistry, SchemaType, parse_schema

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
log = logging.getLogger(__name__)

_REGISTRY = web.AppKey("registry", SchemaRegistry)
# Which of a list of subjects the client may see (the broker's ACLs); all when unset.
SUBJECT_FILTER = web.AppKey("subject_filter", Callable)


def _visible(request: web.Request, subjects: list[str]) -> list[str]:
    visible = request.app.get(SUBJECT_FILTER)
    return visible(request, subjects) if visible is not None else subjects


def _reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type=CONTENT_TYPE)


def _error(status: int, code: int, message: str) -> web.Response:
    return _reply({"error_code": code, "message": message}, status)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    try:
        return await handler(request)
    except RegistryError as exc:
        return _error(exc.http_status, exc.error_code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.status, f"HTTP {exc.status} {exc.reason}")
    except RecursionError:
        # A schema nested deeper than a check or mapping walks: the client's input, not ours.
        log.info("schema registry request refused: nesting too deep (%s %s)", request.method, request.path)
        return _error(422, 42201, "Invalid schema: nested too deeply")
    except Exception:  # the registry keeps serving; the client gets the registry's 500 form
        log.exception("schema registry request failed: %s %s", request.method, request.path)
        return _error(500, 50001, "Error in the backend data store")


async def _run(request: web.Request, fn: Callable, *args) -> Any:
    # SQLite commits fsync: keep them off the event loop.
    return await asyncio.to_thread(fn, *args)


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


# A request body that does not arrive in this time (a client that sent a Content-Length
# longer than its body, or stalled) is answered 408 instead of being waited on forever.
BODY_TIMEOUT_S = 30.0
_BODY_TIMEOUT = web.AppKey("body_timeout", float)


async def _json_body(request: web.Request) -> Any:
    try:
        raw = await asyncio.wait_for(request.read(), request.app[_BODY_TIMEOUT])
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(reason="Request body not received in time") from None
    try:
        return json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise web.HTTPBadRequest(reason="Malformed JSON") from None


async def _body_schema(request: web.Request) -> Schema:
    body = await _json_body(request)
    if not isinstance(body, dict) or "schema" not in body:
        raise InvalidSchemaError("Empty schema")
    return parse_schema(body["schema"], body.get("schemaType"), body.get("references"))


def _schema_body(schema: Schema) -> dict:
    out: dict[str, Any] = {"schema": schema.text}
    if schema.schema_type is not SchemaType.AVRO:
        out["schemaType"] = schema.schema_type.value
    return out


def _version_body(registry: SchemaRegistry, subject: str, version: int, schema_id: int) -> dict:
    schema = registry.schema(schema_id)
    return {"subject": subject, "version": version, "id": schema_id, **_schema_body(schema)}


# ---------------------------------------------------------------- handlers

async def root(request: web.Request) -> web.Response:
    return _reply({})


async def schema_types(request: web.Request) -> web.Response:
    return _reply([t.value for t in SchemaType])


async def schema_by_id(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    schema = await _run(request, reg.schema, _int(request.match_info["id"]))
    return _reply(_schema_body(schema))


async def schema_text_by_id(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    schema = await _run(request, reg.schema, _int(request.match_info["id"]))
    return web.Response(body=schema.text.encode(), content_type=CONTENT_TYPE)


async def schema_id_versions(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    vs = await _run(request, reg.schema_versions, _int(request.match_info["id"]))
    shown = set(_visible(request, sorted({v.subject for v in vs})))
    return _reply([{"subject": v.subject, "version": v.version} for v in vs if v.subject in shown])


async def schema_id_subjects(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    vs = await _run(request, reg.schema_versions, _int(request.match_info["id"]))
    return _reply(_visible(request, sorted({v.subject for v in vs})))


async def list_subjects(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    subjects = await _run(request, reg.subjects, _flag(request, "deleted"))
    prefix = request.query.get("subjectPrefix", "")
    return _reply(_visible(request, [s for s in subjects if s.startswith(prefix)]))


async def list_versions(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    vs = await _run(request, reg.versions, request.match_info["subject"], _flag(request, "deleted"))
    return _reply([v.version for v in vs])


async def register(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    subject = request.match_info["subject"]
    schema = await _body_schema(request)
    schema_id, version = await _run(request, reg.register, subject, schema)
    return _reply({"id": schema_id})


async def lookup(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    subject = request.match_info["subject"]
    schema = await _body_schema(request)
    v = await _run(request, reg.lookup, subject, schema, _flag(request, "deleted"))
    return _reply(await _run(request, _version_body, reg, subject, v.version, v.schema_id))


async def get_version(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    subject = request.match_info["subject"]
    v = await _run(request, reg.version, subject, request.match_info["version"], _flag(request, "deleted"))
    return _reply(await _run(request, _version_body, reg, subject, v.version, v.schema_id))


async def get_version_schema(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    v = await _run(request, reg.version, request.match_info["subject"], request.match_info["version"])
    schema = await _run(request, reg.schema, v.schema_id)
    return web.Response(body=schema.text.encode(), content_type=CONTENT_TYPE)


async def delete_version(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    v = await _run(request, reg.delete_version, request.match_info["subject"], request.match_info["version"],
                   _flag(request, "permanent"))
    return _reply(v)


async def delete_subject(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    vs = await _run(request, reg.delete_subject, request.match_info["subject"], _flag(request, "permanent"))
    return _reply(vs)


async def check_compatibility(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    subject = request.match_info["subject"]
    version = request.match_info.get("version")
    schema = await _body_schema(request)
    problems = await _run(request, reg.test_compatibility, subject, schema, version)
    body: dict[str, Any] = {"is_compatible": not problems}
    if _flag(request, "verbose"):
        body["messages"] = problems
    return _reply(body)


async def get_config(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    subject = request.match_info.get("subject")
    if subject and not _flag(request, "defaultToGlobal"):
        level = await _run(request, reg.subject_compatibility, subject)
    else:
        level = await _run(request, reg.compatibility, subject)
    return _reply({"compatibilityLevel": level.value})


async def put_config(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    body = await _json_body(request)
    level = body.get("compatibility") or body.get("compatibilityLevel") if isinstance(body, dict) else None
    c = await _run(request, reg.set_compatibility, level or "", request.match_info.get("subject"))
    return _reply({"compatibility": c.value})


async def delete_config(request: web.Request) -> web.Response:
    reg = request.app[_REGISTRY]
    c = await _run(request, reg.delete_compatibility, request.match_info.get("subject"))
    return _reply({"compatibilityLevel": c.value})


async def get_mode(request: web.Request) -> web.Response:
    return _reply({"mode": "READWRITE"})


def _int(text: str) -> int:
    """A schema id from a path: ids are 32-bit, anything else names no schema (404)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2 ** 31:
        raise SchemaNotFoundError(f"Schema {text[:40]} not found")
    return value


def make_app(registry: SchemaRegistry, body_timeout_s: float = BODY_TIMEOUT_S) -> web.Application:
    """The registry's HTTP application (mount it on the broker's --http-port)."""
    app = web.Application(middlewares=[_errors], client_max_size=16 * 1024 * 1024)
    app[_REGISTRY] = registry
    app[_BODY_TIMEOUT] = body_timeout_s
    r = app.router
    r.add_get("/", root)
    r.add_get("/schemas/types", schema_types)
    r.add_get("/schemas/ids/{id}", schema_by_id)
    r.add_get("/schemas/ids/{id}/schema", schema_text_by_id)
    r.add_get("/schemas/ids/{id}/versions", schema_id_versions)
    r.add_get("/schemas/ids/{id}/subjects", schema_id_subjects)
    r.add_get("/subjects", list_subjects)
    r.add_post("/subjects/{subject}", lookup)
    r.add_delete("/subjects/{subject}", delete_subject)
    r.add_get("/subjects/{subject}/versions", list_versions)
    r.add_post("/subjects/{subject}/versions", register)
    r.add_get("/subjects/{subject}/versions/{version}", get_version)
    r.add_get("/subjects/{subject}/versions/{version}/schema", get_version_schema)
    r.add_delete("/subjects/{subject}/versions/{version}", delete_version)
    r.add_post("/compatibility/subjects/{subject}/versions", check_compatibility)
    r.add_post("/compatibility/subjects/{subject}/versions/{version}", check_compatibility)
    r.add_get("/config", get_config)
    r.add_put("/config", put_config)
    r.add_delete("/config", delete_config)
    r.add_get("/config/{subject}", get_config)
    r.add_put("/config/{subject}", put_config)
    r.add_delete("/config/{subject}", delete_config)
    r.add_get("/mode", get_mode)
    return app


async def start_http(registry: SchemaRegistry, host: str = "0.0.0.0", port: int = 8081,
                     body_timeout_s: float = BODY_TIMEOUT_S,
                     configure: Callable[[web.Application], None] | None = None,
                     ssl_context: "ssl.SSLContext | None" = None) -> web.AppRunner:
    """Serve the registry in the running event loop (over TLS with `ssl_context`); stop it
    with `await runner.cleanup()`. `configure(app)` adds the broker's other routes (metrics,
    console) and its access checks before it starts."""
    app = make_app(registry, body_timeout_s)
    if configure is not None:
        configure(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    return runner
