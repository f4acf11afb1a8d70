"""The browser demo at ``/demo``: the static page from the source checkout's ``demos/browser``.

The page needs no API key to load; it carries the key itself when it opens ``/v1/realtime``, where the
handshake checks it. An installed wheel has no ``demos`` directory, so the route then explains where the
page lives instead of answering 404.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

DEMO_DIR = Path(__file__).resolve().parents[1] / "demos" / "browser"

MISSING_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>omni-gateway demo</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40rem; margin: 2rem auto">
<h1>The browser demo is not installed</h1>
<p>This server runs from an installed package, which does not ship the demo page. The page lives in the
source repository under <code>demos/browser</code>: install from a checkout with
<code>pip install -e .</code> and start <code>omni serve</code> again, then reload this page.</p>
</body></html>
"""


def _redirect_to_slash(request: Request) -> Response:
    # Relative links in index.html (style.css, app.js) resolve against /demo/, not /. The Location is a path:
    # a URL rebuilt from the request would carry whatever Host header the request brought.
    query = request.url.query
    return RedirectResponse("/demo/" + (f"?{query}" if query else ""), status_code=307)


def _missing(request: Request) -> Response:
    return HTMLResponse(MISSING_PAGE, status_code=404)


def demo_routes(directory: Path = DEMO_DIR) -> list[BaseRoute]:
    """``/demo`` redirects to ``/demo/``, which serves ``directory`` (index.html by default)."""
    redirect = Route("/demo", _redirect_to_slash, methods=["GET", "HEAD"])
    if (directory / "index.html").is_file():
        return [redirect, Mount("/demo", app=StaticFiles(directory=directory, html=True), name="demo")]
    return [redirect, Route("/demo/{path:path}", _missing, methods=["GET", "HEAD"])]
