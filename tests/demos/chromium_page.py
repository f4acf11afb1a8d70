"""Headless Debian Chromium on the demo page, with fake camera and microphone, collecting what went wrong."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, Response, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# No network beyond loopback here: without these Chromium keeps trying to reach its own services.
QUIET_FLAGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FAKE_MEDIA_FLAGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


@contextlib.contextmanager
def demo_page(
    port: int, microphone_wav: Path | None = None, transport: str = "webrtc"
) -> Iterator[tuple[Page, list[str]]]:
    """The page at /demo (through its redirect) and the list of console errors, failed loads and page errors;
    it connects over ``transport`` (``webrtc`` or ``websocket``).

    ``microphone_wav`` (16-bit PCM) is what the fake microphone plays, in a loop; without it Chromium's
    fake microphone beeps. The fake camera shows a moving test pattern.
    """
    if not CHROMIUM.is_file():
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM} (apt-get install -y chromium)")
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text} at {message.location.get('url')}")

    def on_response(response: Response) -> None:
        if response.status >= 400:
            problems.append(f"{response.status} for {response.url}")

    args = QUIET_FLAGS + FAKE_MEDIA_FLAGS
    if microphone_wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={microphone_wav}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 700})
            context.grant_permissions(["microphone", "camera"], origin=f"http://127.0.0.1:{port}")
            page = context.new_page()
            page.on("console", on_console)
            page.on("response", on_response)
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.goto(f"http://127.0.0.1:{port}/demo?transport={transport}")
            yield page, problems
        finally:
            browser.close()


def connect(page: Page) -> None:
    page.click("#connect")
    page.wait_for_selector("#status.live", timeout=30_000)
    page.wait_for_selector("#mic:not([disabled])")
