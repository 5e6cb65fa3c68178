"""Authentication and ACL checks on the HTTP port (schema registry, console, /metrics).

Clients authenticate with HTTP basic credentials of the broker's users (the same users and
passwords as SASL on the Kafka listener). A request without valid credentials gets 401 with
`WWW-Authenticate: Basic` and the registry's JSON error body; an authenticated request the
ACLs do not allow gets 403. What each route needs (Kafka's resources and operations):

Schema registry: a subject follows the ACLs of its topic. TopicNameStrategy subjects
`<topic>-key` and `<topic>-value` name their topic; any other subject (RecordNameStrategy
and the like) is checked as a topic named like the subject, so a literal or prefixed topic
ACL can cover it.
  read a subject (versions, a version, lookup, compatibility check)  DESCRIBE on the topic
  register a version                      WRITE or ALTER on the topic: producers whose
                                          serializers auto-register hold WRITE; schema
                                          administrators who do not produce hold ALTER
  delete a version or a subject           DELETE on the topic
  a subject's compatibility: read / set   DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic
  global compatibility: read / set        DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster
  schemas referenced ($ref) by one sent   DESCRIBE on the referenced subjects' topics
  /schemas/ids/{id}[...]                  DESCRIBE on the topic of any subject using the schema
                                          (a consumer reading the id from a record has READ on
                                          that topic); lists of subjects filtered
  /subjects                               the subjects whose topics may be described
  /, /schemas/types, /mode                any authenticated user
Console: list pages and /metrics need DESCRIBE on the cluster; a table page DESCRIBE on the
table, its rows and lookups READ; a subject page DESCRIBE on the subject's topic; a group
page DESCRIBE on the group; static files any authenticated user.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

from fluvial.schema import rest
from fluvial.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from fluvial.security.basic_auth import CredentialsError, PasswordChecker, parse_basic
from fluvial.security.principal import ANONYMOUS, Principal

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
PRINCIPAL = "fluvial.principal"
UNAUTHORIZED_CODE = 40101   # the registry's error codes: status * 100 + 1
FORBIDDEN_CODE = 40301

Op = AclOperation


def topic_of_subject(subject: str) -> str:
    """The topic whose ACLs a subject follows (TopicNameStrategy: `<topic>-key|-value`)."""
    for suffix in ("-key", "-value"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return subject


@dataclass(frozen=True)
class Need:
    """What a route needs: `kind` names where the resource comes from."""

    kind: str                      # "user" | "cluster" | "subject" | "table" | "group" | "schema"
    operations: tuple[AclOperation, ...] = ()
    param: str = ""                # the route's match_info key naming the resource


USER = Need("user")
GET, POST, PUT, DELETE = "GET", "POST", "PUT", "DELETE"

ROUTES: dict[tuple[str, str], Need] = {
    # schema registry
    (GET, "/"): USER,
    (GET, "/schemas/types"): USER,
    (GET, "/mode"): USER,
    (GET, "/subjects"): USER,  # filtered
    (GET, "/schemas/ids/{id}"): Need("schema", param="id"),
    (GET, "/schemas/ids/{id}/schema"): Need("schema", param="id"),
    (GET, "/schemas/ids/{id}/versions"): Need("schema", param="id"),
    (GET, "/schemas/ids/{id}/subjects"): Need("schema", param="id"),
    (POST, "/subjects/{subject}"): Need("subject", (Op.DESCRIBE,), "subject"),
    (DELETE, "/subjects/{subject}"): Need("subject", (Op.DELETE,), "subject"),
    (GET, "/subjects/{subject}/versions"): Need("subject", (Op.DESCRIBE,), "subject"),
    (POST, "/subjects/{subject}/versions"): Need("subject", (Op.WRITE, Op.ALTER), "subject"),
    (GET, "/subjects/{subject}/versions/{version}"): Need("subject", (Op.DESCRIBE,), "subject"),
    (GET, "/subjects/{subject}/versions/{version}/schema"): Need("subject", (Op.DESCRIBE,), "subject"),
    (DELETE, "/subjects/{subject}/versions/{version}"): Need("subject", (Op.DELETE,), "subject"),
    (POST, "/compatibility/subjects/{subject}/versions"): Need("subject", (Op.DESCRIBE,), "subject"),
    (POST, "/compatibility/subjects/{subject}/versions/{version}"): Need("subject", (Op.DESCRIBE,), "subject"),
    (GET, "/config"): Need("cluster", (Op.DESCRIBE_CONFIGS,)),
    (PUT, "/config"): Need("cluster", (Op.ALTER_CONFIGS,)),
    (DELETE, "/config"): Need("cluster", (Op.ALTER_CONFIGS,)),
    (GET, "/config/{subject}"): Need("subject", (Op.DESCRIBE_CONFIGS,), "subject"),
    (PUT, "/config/{subject}"): Need("subject", (Op.ALTER_CONFIGS,), "subject"),
    (DELETE, "/config/{subject}"): Need("subject", (Op.ALTER_CONFIGS,), "subject"),
    # metrics and console
    (GET, "/metrics"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console"): USER,
    (GET, "/console/"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console/health"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console/tables"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console/tables/{name}"): Need("table", (Op.DESCRIBE,), "name"),
    (GET, "/console/tables/{name}/rows"): Need("table", (Op.READ,), "name"),
    (GET, "/console/tables/{name}/lookup"): Need("table", (Op.READ,), "name"),
    (GET, "/console/schemas"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console/schemas/{subject}"): Need("subject", (Op.DESCRIBE,), "subject"),
    (GET, "/console/groups"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console/groups/{group}"): Need("group", (Op.DESCRIBE,), "group"),
    (GET, "/console/tiering"): Need("cluster", (Op.DESCRIBE,)),
    (GET, "/console/static/{file}"): USER,
}


def _error(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps({"error_code": code, "message": message}).encode(), status=status,
                        content_type=CONTENT_TYPE, headers=headers)


def unauthorized(message: str) -> web.Response:
    return _error(401, UNAUTHORIZED_CODE, message, {"WWW-Authenticate": 'Basic realm="fluvial", charset="UTF-8"'})


class HttpAccess:
    """The HTTP port's gatekeeper for one broker (used as an aiohttp middleware)."""

    def __init__(self, broker, checker: PasswordChecker | None):
        self.broker = broker
        self.checker = checker  # None: no authentication (everyone is ANONYMOUS)

    # -- decisions ---------------------------------------------------------------------------

    def allowed(self, request: web.Request, operation: AclOperation, resource_type: ResourceType,
                name: str) -> bool:
        authorizer = getattr(self.broker, "authorizer", None)
        if authorizer is None:
            return True
        return authorizer.authorize(principal_of(request), request.remote or "", operation, resource_type, name)

    def may_see_subject(self, request: web.Request, subject: str) -> bool:
        return self.allowed(request, Op.DESCRIBE, ResourceType.TOPIC, topic_of_subject(subject))

    def visible_subjects(self, request: web.Request, subjects: list[str]) -> list[str]:
        return [s for s in subjects if self.may_see_subject(request, s)]

    async def _authenticate(self, request: web.Request) -> Principal:
        if self.checker is None:
            return ANONYMOUS
        creds = parse_basic(request.headers.get("Authorization"))
        # A check the user store has not remembered derives the key (milliseconds): off the loop.
        return await asyncio.to_thread(self.checker.check, creds)

    async def _forbidden_reason(self, request: web.Request, need: Need) -> str | None:
        """Why the request is refused, or None when it is allowed."""
        if need.kind == "user":
            return None
        if need.kind == "cluster":
            if any(self.allowed(request, op, ResourceType.CLUSTER, CLUSTER_NAME) for op in need.operations):
                return None
            return f"{_ops(need)} on the cluster"
        name = request.match_info.get(need.param, "")
        if need.kind == "schema":
            return await self._schema_reason(request, name)
        if need.kind == "subject":
            rtype, resource, what = ResourceType.TOPIC, topic_of_subject(name), f"topic {topic_of_subject(name)!r}"
        elif need.kind == "table":
            rtype, resource, what = ResourceType.TOPIC, name, f"topic {name!r}"
        else:
            rtype, resource, what = ResourceType.GROUP, name, f"group {name!r}"
        if not any(self.allowed(request, op, rtype, resource) for op in need.operations):
            return f"{_ops(need)} on {what}"
        if need.kind == "subject" and request.method == POST:
            return await self._references_reason(request)
        return None

    async def _references_reason(self, request: web.Request) -> str | None:
        """A schema sent for registration, lookup or a compatibility check may `$ref` schemas
        of other subjects: reading those needs DESCRIBE on their topics too."""
        try:
            body = json.loads(await asyncio.wait_for(request.read(), rest.BODY_TIMEOUT_S) or b"{}")
        except (ValueError, RecursionError, asyncio.TimeoutError):
            return None  # the handler answers malformed or late bodies the registry's way
        references = body.get("references") if isinstance(body, dict) else None
        for ref in references if isinstance(references, list) else ():
            subject = ref.get("subject") if isinstance(ref, dict) else None
            if isinstance(subject, str) and not self.may_see_subject(request, subject):
                return f"DESCRIBE on topic {topic_of_subject(subject)!r} (the schema references subject {subject!r})"
        return None

    async def _schema_reason(self, request: web.Request, text: str) -> str | None:
        registry = self.broker.extensions.get("registry")
        try:
            schema_id = int(text)
        except ValueError:
            return None  # the handler answers 404
        if registry is None:
            return None
        try:
            versions = await asyncio.to_thread(registry.schema_versions, schema_id)
        except Exception:  # an unknown id: the handler answers 404 the registry's way
            return None
        if not versions or any(self.may_see_subject(request, v.subject) for v in versions):
            return None
        return f"DESCRIBE on the topic of a subject using schema {schema_id}"

    # -- the middleware ------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            principal = await self._authenticate(request)
        except CredentialsError as exc:
            log.info("HTTP request refused (401): %s %s: %s", request.method, request.path, exc)
            return unauthorized(str(exc))
        request[PRINCIPAL] = principal
        route = request.match_info.route
        canonical = route.resource.canonical if route.resource is not None else ""
        need = ROUTES.get((request.method if request.method != "HEAD" else GET, canonical), USER)
        reason = await self._forbidden_reason(request, need)
        if reason is not None:
            log.info("HTTP request refused (403): %s %s by %s", request.method, request.path, principal)
            return _error(403, FORBIDDEN_CODE, f"{principal} is not authorized: {reason} is needed")
        return await handler(request)


def _ops(need: Need) -> str:
    return " or ".join(op.name for op in need.operations)


def principal_of(request: web.Request) -> Principal:
    try:
        return request[PRINCIPAL]
    except KeyError:
        return ANONYMOUS


HTTP_ACCESS = web.AppKey("http_access", HttpAccess)


def install(broker, app: web.Application) -> HttpAccess:
    """Put the gatekeeper in front of every route of the HTTP port (before it starts)."""
    cfg = broker.config.security
    if cfg.http_auth not in ("none", "basic"):
        raise ValueError(f"http_auth must be none or basic, not {cfg.http_auth!r}")
    checker = None
    if cfg.http_auth == "basic":
        users = getattr(broker, "users", None)
        if users is None:
            raise RuntimeError("http_auth=basic needs the broker's user store")
        checker = PasswordChecker(users.verify_password, users.__contains__)
    access = HttpAccess(broker, checker)
    app[HTTP_ACCESS] = access
    app[rest.SUBJECT_FILTER] = access.visible_subjects
    app.middlewares.insert(0, access.middleware)
    return access


def ssl_context(broker):
    """The TLS context of the HTTP port, or None for plain HTTP. Client certificates are not
    asked for, whatever the Kafka listener's ssl.client.auth: browsers and registry clients
    prove who they are with basic credentials here."""
    cfg = broker.config.security
    if not cfg.http_tls:
        return None
    from dataclasses import replace

    from fluvial.security.tls import server_context

    return server_context(replace(cfg, ssl_client_auth="none"))
