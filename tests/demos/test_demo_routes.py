"""The browser demo's routes: served without an API key, redirect to the slash form, a how-to page when absent."""

from __future__ import annotations

from pathlib import Path

from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.demo import DEMO_DIR, demo_routes
from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.harness.fake_backend import FakeBackend


def keyed_client() -> TestClient:
    # A loopback name: the guard refuses Host names off its allow-list (TestClient's default is "testserver").
    return TestClient(create_app(FakeBackend(), GatewayConfig(api_key="sk-demo")), base_url="http://localhost")


def test_demo_redirects_to_the_directory_form_keeping_the_query() -> None:
    response = keyed_client().get("/demo?x=1", follow_redirects=False)
    assert response.status_code == 307
    assert response.headers["location"] == "/demo/?x=1"
    assert keyed_client().get("/demo", follow_redirects=False).headers["location"] == "/demo/"


def test_the_redirect_never_names_the_requests_host() -> None:
    # Served to any Host, the Location still stays on whatever origin the browser is on.
    client = TestClient(create_app(FakeBackend(), GatewayConfig(allowed_hosts=("*",))), base_url="http://evil.example")
    response = client.get("/demo?x=1", follow_redirects=False, headers={"Host": "evil.example:8000"})
    assert response.status_code == 307 and response.headers["location"] == "/demo/?x=1"
    assert "evil" not in response.headers["location"]


def test_the_demo_page_is_refused_to_a_host_off_the_allow_list() -> None:
    client = TestClient(create_app(FakeBackend(), GatewayConfig()), base_url="http://evil.example")
    for path in ("/demo", "/demo/"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 421 and response.json()["error"]["code"] == "host_not_allowed", path


def test_page_and_its_assets_load_without_a_key_while_the_api_still_wants_one() -> None:
    client = keyed_client()
    page = client.get("/demo/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == (DEMO_DIR / "index.html").read_text()
    for asset, kind in (("app.js", "javascript"), ("worklets.js", "javascript"), ("style.css", "text/css")):
        response = client.get(f"/demo/{asset}")
        assert response.status_code == 200 and kind in response.headers["content-type"], asset
    assert client.get("/demo/missing.js").status_code == 404
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-demo"}).status_code == 200


def test_page_references_only_files_that_exist() -> None:
    html = (DEMO_DIR / "index.html").read_text()
    for name in ("style.css", "app.js"):
        assert f'"{name}"' in html and (DEMO_DIR / name).is_file()
    assert 'addModule("worklets.js")' in (DEMO_DIR / "app.js").read_text()


def test_without_the_demo_directory_a_page_says_how_to_get_it(tmp_path: Path) -> None:
    client = TestClient(Starlette(routes=demo_routes(tmp_path / "absent")))
    response = client.get("/demo/")
    assert response.status_code == 404 and "demos/browser" in response.text and "pip install -e" in response.text
    assert client.get("/demo", follow_redirects=False).status_code == 307
