"""The web console: read-only pages on the broker's HTTP listener at /console."""
from __future__ import annotations

from aiohttp import web

from fluvial.broker.broker import on_http_app


@on_http_app
def add_console(broker, app: web.Application) -> None:
    from fluvial.broker.console.app import PREFIX, make_console

    async def to_console(request: web.Request) -> web.Response:
        raise web.HTTPFound(PREFIX + "/")

    app.router.add_get(PREFIX, to_console)
    app.add_subapp(PREFIX, make_console(broker))
