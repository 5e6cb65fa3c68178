"""The web console's routes: read-only pages rendered on the server (jinja2).

Each handler gathers its page on a worker thread (`views`, `rows`) and renders it on the
loop. Errors become plain HTML pages with the right status and the reason: 404 for
unknown tables, subjects and groups, 400 for parameters that cannot be used, 500 (with
the details in the broker's log, never in the page) for anything else.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import jinja2
from aiohttp import web

from fluvial.broker.console import charts, rows, views
from fluvial.broker.metrics_history import MetricsHistory

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
# Files under /console/static: a fixed list, so no request names a path of its own.
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
PREFIX = "/console"

_BROKER = web.AppKey("broker", object)
_TEMPLATES = web.AppKey("templates", jinja2.Environment)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined)
    env.filters["bytes"] = _human_bytes
    env.filters["count"] = lambda n: "-" if n is None else f"{n:,}"
    env.filters["duration"] = _duration
    env.globals["prefix"] = PREFIX
    return env


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}d {h}h {m}m" if d else f"{h}h {m}m {s}s" if h else f"{m}m {s}s"


async def _render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    # Rendered on a worker thread: a page of 1,000 rows is milliseconds of CPU the loop's
    # clients should not wait for (jinja2 templates render concurrently).
    env = request.app[_TEMPLATES]
    html = await _off_loop(lambda: env.get_template(template).render(
        nav=context.pop("nav", ""), now=time.strftime("%H:%M:%S"), **context))
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store"})


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    try:
        return await handler(request)
    except views.NotFound as exc:
        return await _error_page(request, 404, "Not found", str(exc))
    except (rows.BadParameter, ValueError) as exc:
        return await _error_page(request, 400, "Bad request", str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return await _error_page(request, exc.status, exc.reason, f"{request.path} cannot be shown.")
    except Exception:  # the console keeps serving; the details go to the log, not the page
        log.exception("console page %s failed", request.path_qs)
        return await _error_page(request, 500, "Internal error",
                           "The page could not be built; the broker's log has the details.")


async def _error_page(request: web.Request, status: int, title: str, message: str) -> web.Response:
    return await _render(request, "error.html", status=status, title=title, code=status, message=message)


def _broker(request: web.Request):
    return request.app[_BROKER]


async def _off_loop(fn: Callable, *args) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _history(request: web.Request) -> MetricsHistory | None:
    metrics = _broker(request).extensions.get("metrics")
    return metrics.history if metrics is not None else None


# -- pages --------------------------------------------------------------------------------

async def overview(request: web.Request) -> web.Response:
    broker = _broker(request)
    info = await _off_loop(views.overview, broker)
    history = _history(request)

    def draw() -> list[str]:
        if history is None:
            return []
        return [charts.line_chart("Records per second (all tables)", history.rates(), chart_id="chart-records"),
                charts.line_chart("Bytes per second (all tables)", history.byte_rates(), chart_id="chart-bytes"),
                charts.line_chart("Consumer group lag (records)", history.group_lag(), chart_id="chart-lag"),
                charts.line_chart("Event loop lag, worst per sample (ms)", history.loop_lag_series(),
                                  chart_id="chart-loop")]

    chart_html = await _off_loop(draw)  # an hour of samples of every table: not on the loop
    return await _render(request, "overview.html", nav="overview", info=info, charts=chart_html, refresh=True)


async def health(request: web.Request) -> web.Response:
    info = await _off_loop(views.overview, _broker(request))
    return web.json_response({"healthy": info["healthy"], "offline_buckets": info["offline"],
                              "connections": info["connections"], "uptime_s": info["uptime_s"]},
                             status=200 if info["healthy"] else 503)


async def tables(request: web.Request) -> web.Response:
    listing = await _off_loop(views.table_rows, _broker(request))
    return await _render(request, "tables.html", nav="tables", tables=listing, refresh=True)


async def table(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    detail = await _off_loop(views.table_detail, _broker(request), name)
    history = _history(request)
    chart = await _off_loop(lambda: charts.line_chart(f"Records per second: {name}", history.rates(name),
                                                      chart_id="chart-table")) if history is not None else ""
    return await _render(request, "table.html", nav="tables", t=detail, chart=chart, refresh=True)


async def table_rows(request: web.Request) -> web.Response:
    broker = _broker(request)
    t = views.table_or_404(broker, request.match_info["name"])
    q = await _off_loop(rows.parse_query, t, request.query)
    page = await _off_loop(rows.browse, broker, t, q)
    template = "rows_fragment.html" if request.query.get("fragment") == "1" else "rows.html"
    users = await _off_loop(lambda: [f.name for f in views.user_schema(t)])
    return await _render(request, template, nav="tables", name=t.name, q=q, page=page, all_columns=users,
                   buckets=len(t.buckets), max_limit=rows.MAX_LIMIT, live=request.query.get("live") == "1",
                   query_string=request.query_string)


async def table_lookup(request: web.Request) -> web.Response:
    broker = _broker(request)
    name = request.match_info["name"]
    detail = await _off_loop(views.table_detail, broker, name)
    if not detail["primary_key"]:
        raise ValueError(f"table {name!r} has no primary key: lookups need a primary-key table")
    keys = {c: request.query.get(c, "") for c in detail["primary_key"]}
    result = None
    if any(keys.values()):
        loop = asyncio.get_running_loop()
        result = await _off_loop(views.lookup, broker, loop, name, keys)
    return await _render(request, "lookup.html", nav="tables", t=detail, keys=keys, result=result)


async def schemas(request: web.Request) -> web.Response:
    registry = _broker(request).extensions.get("registry")
    subjects = await _off_loop(views.subjects, registry) if registry is not None else []
    return await _render(request, "schemas.html", nav="schemas", subjects=subjects)


async def schema_subject(request: web.Request) -> web.Response:
    registry = _broker(request).extensions.get("registry")
    if registry is None:
        raise views.NotFound("The schema registry is not running.")
    detail = await _off_loop(views.subject_detail, registry, request.match_info["subject"],
                             request.query.get("left"), request.query.get("right"))
    return await _render(request, "subject.html", nav="schemas", s=detail)


async def groups(request: web.Request) -> web.Response:
    listing = await _off_loop(views.group_rows, _broker(request))
    return await _render(request, "groups.html", nav="groups", groups=listing, refresh=True)


async def group(request: web.Request) -> web.Response:
    group_id = request.match_info["group"]
    detail = await _off_loop(views.group_detail, _broker(request), group_id)
    history = _history(request)
    chart = await _off_loop(lambda: charts.line_chart(f"Lag of {group_id} (records)", history.group_lag(group_id),
                                                      chart_id="chart-group")) if history is not None else ""
    return await _render(request, "group.html", nav="groups", g=detail, chart=chart, refresh=True)


async def tiering(request: web.Request) -> web.Response:
    info = await _off_loop(views.tiering, _broker(request))
    return await _render(request, "tiering.html", nav="tiering", info=info, refresh=True)


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["file"]
    kind = STATIC.get(name)
    if kind is None:
        raise views.NotFound(f"There is no file {name!r}.")
    body = await _off_loop((HERE / "static" / name).read_bytes)
    return web.Response(body=body, content_type=kind, headers={"Cache-Control": "max-age=300"})


async def not_found(request: web.Request) -> web.Response:
    raise views.NotFound(f"There is no console page at {request.path}.")


def make_console(broker) -> web.Application:
    """The console as an aiohttp sub-application (mounted at /console)."""
    app = web.Application(middlewares=[_errors])
    app[_BROKER] = broker
    app[_TEMPLATES] = _environment()
    r = app.router
    r.add_get("/", overview)
    r.add_get("/health", health)
    r.add_get("/tables", tables)
    r.add_get("/tables/{name}", table)
    r.add_get("/tables/{name}/rows", table_rows)
    r.add_get("/tables/{name}/lookup", table_lookup)
    r.add_get("/schemas", schemas)
    r.add_get("/schemas/{subject}", schema_subject)
    r.add_get("/groups", groups)
    r.add_get("/groups/{group}", group)
    r.add_get("/tiering", tiering)
    r.add_get("/static/{file}", static)
    r.add_get("/{tail:.*}", not_found)
    return app
