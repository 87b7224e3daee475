"""The documentation site, built with ``mkdocs build --strict`` and opened in headless Chromium.

Checks what a reader meets: every page renders (no error in the browser console), the
search finds things, and the API reference lists every public name of the package.

The browser is Debian's ``chromium`` driven through Debian's ``chromium-driver`` (Selenium
never downloads one). Where they are not installed the test is skipped, except under CI
(``CI`` set), where it must run.
"""

from __future__ import annotations

import functools
import http.server
import inspect
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aioprod
import aioprod.config
import aioprod.embedded
import aioprod.errors
import aioprod.spark

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
API_PAGES = (
    "api/producer/",
    "api/transactions/",
    "api/sync/",
    "api/config/",
    "api/security/",
    "api/errors/",
    "api/embedded/",
    "api/spark/",
)
WAIT = 20  # seconds a page element may take to appear: a bound for a hang, not a timing check


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it: strict, so a broken link or reference fails the build."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert build.returncode == 0, build.stderr
    return out


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        message = f"{', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"the docs browser test must run in CI: {message}", pytrace=False)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def site_pages(site: Path) -> list[str]:
    """Every page of the site (``index.html`` files), as URL paths."""
    pages = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    return ["" if page == "." else page + "/" for page in pages]


def wait_for(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT).until(expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css)))


def test_every_page_renders(site: Path, base_url: str, browser: Any) -> None:
    pages = site_pages(site)
    for required in ("", "architecture/", "cli/", *API_PAGES):
        assert required in pages
    for page in pages:
        browser.get(base_url + page)  # returns once the page has loaded
        heading, layout = browser.execute_script(
            "const h1 = document.querySelector('article h1');"
            "return [h1 ? h1.textContent.trim() : '', !!document.querySelector('nav.md-nav--primary')];"
        )
        assert heading, page
        assert layout, page  # Material's layout rendered
        assert browser.title.endswith("aioprod"), (page, browser.title)
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []  # no failed resource, no script error, on any page


def test_search_finds_send_many(base_url: str, browser: Any) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(base_url)
    wait_for(browser, "label.md-search__icon, .md-search__input")
    browser.execute_script("document.querySelector('.md-search__input').focus()")
    search = browser.find_element(By.CSS_SELECTOR, ".md-search__input")
    search.send_keys("send_many")

    seen: list[tuple[str, str]] = []

    def hits(driver: Any) -> bool:
        # Read in one script: the results re-render as the index loads and the query runs (first
        # for what is typed so far), and an element found one call before may be gone the next
        # (StaleElementReferenceException). Wait for the API entry, not for the first hit.
        found: list[str] = driver.execute_script(
            "return Array.from(document.querySelectorAll('.md-search-result__item a'))"
            ".filter(a => a.innerText.toLowerCase().includes('send_many')).map(a => a.href);"
        )
        seen[:] = [(url.path, url.fragment) for url in map(urllib.parse.urlsplit, found)]
        return ("/api/producer/", "aioprod.Producer.send_many") in seen

    try:
        WebDriverWait(browser, WAIT).until(hits)
    except TimeoutException:
        pytest.fail(f"the search for send_many never listed Producer.send_many; it listed {seen}")


def public_names() -> set[str]:
    """The fully qualified names a reader must find in the API reference."""
    names: set[str] = set()

    def add_class(path: str, cls: type) -> None:
        names.add(path)
        for member, value in vars(cls).items():
            if not member.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                names.add(f"{path}.{member}")

    for name in aioprod.__all__:
        obj = getattr(aioprod, name)
        home = (
            "aioprod"
            if obj.__module__.startswith("aioprod.producer") or obj is aioprod.SyncProducer
            else obj.__module__
        )
        add_class(f"{home}.{name}", obj)
    for name, obj in vars(aioprod.errors).items():
        if inspect.isclass(obj) and obj.__module__ == "aioprod.errors" and not name.startswith("_"):
            names.add(f"aioprod.errors.{name}")
    names |= {"aioprod.errors.error_for_code", "aioprod.errors.ERRORS_BY_CODE"}
    names |= {"aioprod.config.ProducerConfig", "aioprod.config.ProducerConfig.from_options"}
    names |= {"aioprod.config.check_option", "aioprod.config.Secret", "aioprod.config.Secret.reveal"}
    names |= {"aioprod.net.auth.OAuthBearerToken", "aioprod.net.auth.msk_iam_token_provider"}
    names |= {f"aioprod.embedded.{name}" for name in aioprod.embedded.__all__}
    names |= {f"aioprod.spark.{name}" for name in aioprod.spark.__all__}
    return names


def test_the_api_reference_lists_every_public_name(base_url: str, browser: Any) -> None:
    shown: dict[str, str] = {}
    for page in API_PAGES:
        browser.get(base_url + page)
        shown.update(
            browser.execute_script(
                "const shown = {};"
                "for (const e of document.querySelectorAll(\"article [id^='aioprod']\")) shown[e.id] = e.textContent;"
                "return shown;"
            )
        )
    expected = public_names()
    assert {"aioprod.Producer.send_many", "aioprod.RecordFuture", "aioprod.SyncProducer"} <= expected
    assert len([n for n in expected if n.startswith("aioprod.errors.")]) > 100  # the broker error classes
    missing = sorted(expected - set(shown))
    assert missing == [], f"not in the API reference: {missing}"
    for name in expected:  # each is a visible heading naming it
        assert name.rsplit(".", 1)[-1] in shown[name], (name, shown[name])
