"""The built documentation, as a reader sees it in a browser, on a phone and a desktop.

Debian's Chromium (``/usr/bin/chromium``: ``scripts/test`` installs it with apt-get),
driven by Playwright, headless, opens the built site served on a loopback port, at 400
and 1280 pixels wide, and checks that:

- no page scrolls sideways (wide tables and code scroll inside themselves): every page
  of the build on a phone, and the pages of :data:`PAGES` on a desktop too;
- on a phone, a page's title is on the first screen (the sidebar folds away);
- every page has its previous/next links, visible;
- every code block has a copy button;
- the site's search finds ``publish_nowait``.

Nothing is downloaded: no browser of Playwright's own, no font, no page from elsewhere.
The site is ``$TXNSQ_DOCS_HTML`` (``scripts/test`` builds it first and exports it), or a
build made here. Without Chromium or Playwright the test is skipped, except in CI
(``CI=true``), where that is a failure. ``TXNSQ_DOCS_SCREENSHOTS=DIR`` saves a screenshot
of every page checked, at both widths, into ``DIR``.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from tests.support.env import LOOPBACK, REPO, in_ci

pytestmark = [pytest.mark.integration, pytest.mark.once]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE, DESKTOP = 400, 1280
HEIGHT = 800
#: The pages checked: the landing page, the tutorial, the new reader's pages, the
#: reference pages with the widest content (signatures, generated tables), an
#: explanation and the changelog.
PAGES = (
    "index.html",
    "tutorial.html",
    "glossary.html",
    "howto/pynsq.html",
    "howto/twistd-application.html",
    "howto/logging.html",
    "howto/batching.html",
    "reference/producer.html",
    "reference/consumer.html",
    "reference/settings.html",
    "reference/errors.html",
    "reference/spark.html",
    "reference/options.html",
    "explanation/delivery.html",
    "project/changelog.html",
)
#: Milliseconds any one wait in the browser may take.
WAIT_MS = 10_000


def _unavailable(why: str) -> None:
    if in_ci():
        raise AssertionError(f"{why} (CI=true: the browser test must run)")
    raise SkipTest(why)


def built_site() -> Path:
    """The built HTML: ``$TXNSQ_DOCS_HTML``, or a build made now (removed at exit)."""
    given = os.environ.get("TXNSQ_DOCS_HTML")
    if given and (Path(given) / "index.html").exists():
        return Path(given)
    out = Path(tempfile.mkdtemp(prefix="txnsq-docs-site-"))
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-d", str(out / "doctrees"),
         str(REPO / "docs"), str(out / "html")],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"the docs build failed:\n{done.stderr}")
    return out / "html"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serving(root: Path) -> Iterator[str]:
    """Serve ``root`` on a free loopback port; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class DocsSiteTests(SynchronousTestCase):
    """The site at a phone's and a desktop's width. (SynchronousTestCase: Playwright's
    synchronous API must not run inside a running event loop, which trial's TestCase
    would start.)"""

    @classmethod
    def setUpClass(cls) -> None:
        if not os.access(CHROMIUM, os.X_OK):
            _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            _unavailable("Playwright is missing (pip install -e '.[test]')")
        cls.site = built_site()
        cls._serving = serving(cls.site)
        cls.base = cls._serving.__enter__()
        cls._playwright = sync_playwright().start()
        try:
            cls.browser = cls._playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS
            )
        except Exception:
            cls._playwright.stop()
            cls._serving.__exit__(None, None, None)
            raise
        cls.screenshots = os.environ.get("TXNSQ_DOCS_SCREENSHOTS")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.browser.close()
        cls._playwright.stop()
        cls._serving.__exit__(None, None, None)

    def new_page(self, width: int) -> Any:
        """A browser page ``width`` pixels wide, closed in cleanup, that may load
        nothing but the local server's pages."""
        context = self.browser.new_context(viewport={"width": width, "height": HEIGHT})
        self.addCleanup(context.close)
        context.route(
            "**/*",
            lambda route: route.continue_() if route.request.url.startswith(self.base)
            else route.abort(),
        )
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        return page

    def visit(self, page: Any, path: str) -> None:
        """Show ``path`` in ``page`` (and save its screenshot when asked)."""
        response = page.goto(self.base + path, wait_until="load")
        assert response is not None
        self.assertEqual(response.status, 200, path)
        if self.screenshots:
            width = page.viewport_size["width"]
            name = path.removesuffix(".html").replace("/", "_").partition("?")[0]
            page.screenshot(path=os.path.join(self.screenshots, f"{name}-{width}.png"))

    def open(self, width: int, path: str) -> Any:
        """A new page ``width`` pixels wide showing ``path``."""
        page = self.new_page(width)
        self.visit(page, path)
        return page

    def test_pages_exist(self) -> None:
        for path in PAGES:
            self.assertTrue((self.site / path).exists(), path)

    def check_layout(self, width: int) -> None:
        problems = []
        page = self.new_page(width)
        for path in PAGES:
            self.visit(page, path)
            scroll_width = page.evaluate("document.scrollingElement.scrollWidth")
            if scroll_width > width:
                problems.append(f"{path}: {scroll_width} px wide in a {width} px window")
            title_top = page.evaluate("document.querySelector('article h1')"
                                      ".getBoundingClientRect().top")
            if title_top >= HEIGHT:
                problems.append(f"{path}: the title starts {title_top:.0f} px down")
            related = page.locator(".related-pages a")
            if related.count() == 0 or not all(
                related.nth(i).is_visible() for i in range(related.count())
            ):
                problems.append(f"{path}: no visible previous/next link")
            blocks = page.locator("div.highlight").count()
            buttons = page.locator("div.highlight button.copybtn").count()
            if buttons != blocks:
                problems.append(f"{path}: {blocks} code blocks, {buttons} copy buttons")
        self.assertEqual(problems, [])

    def test_phone(self) -> None:
        self.check_layout(PHONE)

    def test_desktop(self) -> None:
        self.check_layout(DESKTOP)

    def test_no_page_scrolls_sideways_on_a_phone(self) -> None:
        """Every page of the build, not only :data:`PAGES`."""
        paths = sorted(
            str(path.relative_to(self.site)) for path in self.site.rglob("*.html")
            if path.parts[len(self.site.parts)] not in ("_modules", "_sources")
            and path.name not in ("genindex.html", "search.html", "py-modindex.html")
        )
        self.assertGreater(len(paths), len(PAGES))
        page = self.new_page(PHONE)
        wide = {}
        for path in paths:
            page.goto(self.base + path, wait_until="load")
            scroll_width = page.evaluate("document.scrollingElement.scrollWidth")
            if scroll_width > PHONE:
                wide[path] = scroll_width
        self.assertEqual(wide, {})

    def test_phone_menu_folds_away(self) -> None:
        """On a phone the navigation is behind a button, not above the content."""
        page = self.open(PHONE, "reference/producer.html")
        drawer = page.locator(".sidebar-drawer").bounding_box()
        assert drawer is not None
        self.assertLessEqual(drawer["x"] + drawer["width"], 0)  # off the screen, left
        self.assertTrue(page.locator(".mobile-header .nav-overlay-icon").is_visible())

    def test_search_finds_publish_nowait(self) -> None:
        """Typed into the sidebar's search box, as a reader would."""
        page = self.open(DESKTOP, "index.html")
        page.locator("input.sidebar-search").fill("publish_nowait")
        page.locator("input.sidebar-search").press("Enter")
        page.wait_for_url("**/search.html?q=publish_nowait*")
        results = page.locator("#search-results ul.search li a")
        results.first.wait_for(state="visible")
        hrefs = [results.nth(i).get_attribute("href") or "" for i in range(results.count())]
        self.assertTrue(any("howto/batching" in h for h in hrefs), hrefs)
        self.assertTrue(any("reference/producer" in h for h in hrefs), hrefs)
