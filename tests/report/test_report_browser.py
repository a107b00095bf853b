"""The report and the store browser opened in headless Chromium, as a person would open them:
no console errors, the verdict on top, every plot drawn with a size, every link to a
history line and to a node log resolving. Screenshots of both pages are kept as artifacts
($MAO_TEST_ARTIFACTS when set, as .ci/run does; else pytest's temporary folder).

Chromium and its driver are Debian's (installed with apt-get when missing, as root);
selenium is pointed at /usr/bin/chromedriver and never downloads one. In CI (CI set) a
missing browser fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from nemesis.report import browser
from nemesis.report.serve import serve_in_thread

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def driver():  # noqa: ANN201
    why = browser.ensure_chromium()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"headless Chromium unavailable in CI: {why}")
        pytest.skip(f"headless Chromium unavailable: {why}")
    pytest.importorskip("selenium")
    chrome = browser.start_driver()
    yield chrome
    chrome.quit()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("MAO_TEST_ARTIFACTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _console_errors(driver) -> list[str]:  # noqa: ANN001
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _check_page_renders(driver) -> None:  # noqa: ANN001
    images = driver.execute_script(
        "return [...document.images].map(i => [i.id, i.complete, i.naturalWidth,"
        " i.getBoundingClientRect().width, i.getBoundingClientRect().height]);")
    assert [i[0] for i in images] == ["plot-latency", "plot-rate"]
    for ident, complete, natural, width, height in images:
        assert complete and natural > 0 and width > 0 and height > 0, (ident, natural, width)


def _check_links(driver, run_dir: Path) -> int:  # noqa: ANN001
    """Every in-page link has its target; every relative link names an existing file."""
    hrefs = driver.execute_script(
        "return [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));")
    checked = 0
    for href in hrefs:
        if href.startswith("#"):
            assert driver.execute_script("return document.getElementById(arguments[0]) !== null;",
                                         href[1:]), f"dangling in-page link {href}"
        else:
            parts = urlsplit(href)
            assert not parts.scheme, f"link leaves the run folder: {href}"
            target = run_dir / unquote(parts.path)
            assert target.exists(), f"broken link {href}"
            if parts.fragment:  # e.g. timeline.html#failing-op: the id is in that page
                assert f"id='{parts.fragment}'" in target.read_text(encoding="utf-8"), href
        checked += 1
    return checked


def test_caught_canary_report_in_a_browser(driver, invalid_run: Path, artifacts: Path) -> None:  # noqa: ANN001
    driver.get_log("browser")  # drop anything earlier
    driver.get((invalid_run / "report.html").as_uri())
    verdict = driver.find_element("id", "verdict")
    assert verdict.text.startswith("INVALID: on key 'k', get('k') -> 'k6' @v6")
    assert verdict.value_of_css_property("background-color") == "rgba(176, 0, 32, 1)"
    _check_page_renders(driver)
    svg = driver.execute_script(
        "const r = document.querySelector('svg.cx').getBoundingClientRect(); return [r.width, r.height];")
    assert svg[0] > 0 and svg[1] > 0
    assert _check_links(driver, invalid_run) > 20
    # Clicking the red bar (the operation that cannot be placed) shows its history line.
    driver.find_element("css selector", "svg.cx text.blocking").click()
    target = driver.execute_script("return location.hash;")
    assert target.startswith("#L")
    line = driver.find_element("id", target[1:]).text
    assert '"node":"n3"' in line and '"value":"k6"' in line
    # A node log opens from disk.
    driver.get((invalid_run / "nodes" / "n3.log").as_uri())
    assert '"node": "n3"' in driver.find_element("tag name", "body").text
    driver.get((invalid_run / "report.html").as_uri())
    browser.full_page_screenshot(driver, artifacts / "report-invalid.png")
    assert _console_errors(driver) == []


def test_valid_report_in_a_browser(driver, valid_run: Path, artifacts: Path) -> None:  # noqa: ANN001
    driver.get_log("browser")
    driver.get((valid_run / "report.html").as_uri())
    assert driver.find_element("id", "verdict").text.startswith("VALID: 29 operations")
    _check_page_renders(driver)
    _check_links(driver, valid_run)
    browser.full_page_screenshot(driver, artifacts / "report-valid.png")
    assert _console_errors(driver) == []


def test_serve_page_in_a_browser(driver, report_store: Path, artifacts: Path) -> None:  # noqa: ANN001
    server, thread = serve_in_thread(report_store)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        driver.get_log("browser")
        driver.set_window_size(1280, 900)
        driver.get(base + "/")
        cells = driver.find_elements("css selector", "td.verdict")
        assert [c.text for c in cells] == ["crashed", "invalid", "valid"]
        browser.full_page_screenshot(driver, artifacts / "serve-index.png")
        driver.find_elements("link text", "report")[1].click()  # the caught canary
        assert driver.find_element("id", "verdict").text.startswith("INVALID")
        _check_page_renders(driver)
        for href in driver.execute_script(
                "return [...document.querySelectorAll('#files a')].map(a => a.href);"):
            driver.get(href)
            assert "404" not in driver.title and "403" not in driver.title, href
        assert _console_errors(driver) == []
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _long_invalid_timeline(path: Path, writes: int) -> Path:
    """A key of `writes` sequential writes by two processes, then a stale read of the first
    value: its timeline is tens of thousands of pixels wide, the failure at its far end."""
    from checker import check_linearizable, models
    from checker.timeline import render_html
    from histories.ops import Op, OpType
    from histories.pairing import pair_operations

    spec = []
    for n in range(writes):
        spec += [(n % 2, OpType.INVOKE, "write", n), (n % 2, OpType.OK, "write", n)]
    spec += [(5, OpType.INVOKE, "read", None), (5, OpType.OK, "read", 0)]
    operations = pair_operations(
        [Op(index=i, process=p, type=t, f=f, value=v) for i, (p, t, f, v) in enumerate(spec)])
    model = models.cas_register(None)
    result = check_linearizable(operations, model, budget_s=60)
    assert result.valid is False
    path.write_text(render_html(result, operations, model, title="long key"), encoding="utf-8")
    return path


@pytest.mark.parametrize("fragment", ["", "#failing-op"])
def test_the_timeline_opens_on_the_failing_operation(driver, tmp_path: Path, artifacts: Path,  # noqa: ANN001
                                                     fragment: str) -> None:
    page = _long_invalid_timeline(tmp_path / "timeline.html", 2500)
    driver.get_log("browser")
    driver.set_window_size(1280, 900)
    driver.get(page.as_uri() + fragment)
    where = driver.execute_script(
        "const r = document.getElementById('failing-op').getBoundingClientRect();"
        "return [r.left, r.right, r.top, r.bottom, innerWidth, innerHeight, scrollX,"
        " document.documentElement.scrollWidth];")
    left, right, top, bottom, width, height, scroll_x, page_width = where
    assert page_width > 20 * width  # the page is far wider than the window
    assert scroll_x > 0  # opened scrolled, not at the top left
    assert 0 <= left < width and right > 0 and 0 <= top < height and bottom > 0, where
    if not fragment:
        driver.save_screenshot(str(artifacts / "timeline-opens-on-failure.png"))
    assert _console_errors(driver) == []
