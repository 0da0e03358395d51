"""The dashboard laid out for a phone (390x844) and a desktop (1280x800), in headless
Chromium: on a phone the failed list shows each job's error and its Retry/Delete buttons
within the screen, and the overview each queue's counts and status; on a desktop the
overview table fits without scrolling. Screenshots of each page at each size go to
``build/web-layout/`` (or $EMQ_TEST_ARTIFACTS), to look at."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import test_web_browser
from test_web_browser import LiveServer
from selenium.webdriver.common.by import By  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402

ARTIFACTS = Path(os.environ.get("EMQ_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parent.parent / "build" / "web-layout")
PHONE, DESKTOP = (390, 844), (1280, 800)
browser = test_web_browser.browser  # the module's Chromium (a fixture)
LONG_ERROR = ("ConnectionRefusedError: could not reach smtp.example.com:587 after 3 tries "
              "(timeout 10 s); the mail for ada@example.com stays queued")


def fail(job):
    raise RuntimeError(LONG_ERROR)


@pytest.fixture
def queues(conn, qname):
    """A queue with failed jobs (long errors) and work in most states, plus a second queue
    with a long name and a rate limit."""
    q = emqfast.Queue(qname, conn)
    for i in range(3):
        q.enqueue({"to": f"user{i}@example.com"}, attempts=1)
    emqfast.Worker(q, fail).run_until_idle(timeout_s=30)
    q.enqueue({"n": 1})
    q.enqueue_in({"later": True}, 3_600_000)
    q.set_rate_limit(100, 60_000)
    other = emqfast.Queue(qname + "-billing-invoices-eu-west", conn)
    other.enqueue({"n": 2}, group="tenant-7")
    other.set_rate_limit(1000, 1000)
    return q, other


def view(driver, size, url: str, name: str) -> None:
    """Open ``url`` in a viewport of ``size`` (a phone's: mobile emulation) and save a
    screenshot ``name-<width>.png``."""
    w, h = size
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": w, "height": h, "deviceScaleFactor": 1, "mobile": w < 600})
    driver.get(url)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}-{w}.png"))


def box(driver, element) -> dict:
    return driver.execute_script(
        "var r = arguments[0].getBoundingClientRect();"
        "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,"
        " width: r.width, height: r.height};", element)


def on_screen(driver, element, width: int) -> bool:
    """The element is drawn (not empty) and its whole width is within the viewport."""
    b = box(driver, element)
    return b["width"] > 0 and b["height"] > 0 and b["left"] >= 0 and b["right"] <= width


def page_width(driver) -> int:
    return int(driver.execute_script("return document.documentElement.scrollWidth"))


def test_the_failed_list_on_a_phone_shows_errors_and_buttons(browser, redis_url,
                                                             queues):
    q, _ = queues
    with LiveServer(create_app(redis_url, queues=[q.name])) as live:
        view(browser, PHONE, f"{live.url}/queue?q={q.name}&state=failed", "failed")
        try:
            assert page_width(browser) <= PHONE[0]
            rows = browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
            assert len(rows) == 3
            first = rows[0]
            for sel in ("td.id a", "td.err"):
                el = first.find_element(By.CSS_SELECTOR, sel)
                assert on_screen(browser, el, PHONE[0]), (sel, box(browser, el))
            assert "smtp.example.com" in first.find_element(By.CSS_SELECTOR, "td.err").text
            every = browser.find_element(By.CSS_SELECTOR, "[data-select-all]")
            assert on_screen(browser, every, PHONE[0])  # the bulk actions' select-all box
            for label in ("Retry", "Delete"):
                button = first.find_element(By.XPATH, f".//button[normalize-space()='{label}']")
                assert on_screen(browser, button, PHONE[0]), (label, box(browser, button))
        finally:
            browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_the_overview_on_a_phone_shows_each_queues_counts(browser, redis_url,
                                                           queues):
    q, other = queues
    with LiveServer(create_app(redis_url, queues=[q.name, other.name])) as live:
        view(browser, PHONE, live.url + "/", "overview")
        try:
            assert page_width(browser) <= PHONE[0]
            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-q="{q.name}"]')
            for key in ("pending", "failed", "scheduled", "paused", "rate_limit", "done_min"):
                cell = row.find_element(By.CSS_SELECTOR, f'td[data-k="{key}"]')
                assert on_screen(browser, cell, PHONE[0]), (key, box(browser, cell))
            failed = row.find_element(By.CSS_SELECTOR, 'td[data-k="failed"]')
            label = browser.execute_script(
                "return getComputedStyle(arguments[0], '::before').content", failed)
            assert failed.text == "3" and label == '"failed"'  # labelled on a phone
        finally:
            browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_the_overview_fits_a_desktop_without_scrolling(browser, redis_url,
                                                         queues):
    q, other = queues
    with LiveServer(create_app(redis_url, queues=[q.name, other.name])) as live:
        view(browser, DESKTOP, live.url + "/", "overview")
        try:
            table = browser.find_element(By.ID, "queues")
            holder = table.find_element(By.XPATH, "..")
            overflow = browser.execute_script(
                "return arguments[0].scrollWidth - arguments[0].clientWidth", holder)
            assert overflow <= 0, f"the overview table overflows by {overflow} px"
            assert page_width(browser) <= DESKTOP[0]
            right = box(browser, holder)["right"]
            for th in table.find_elements(By.CSS_SELECTOR, "thead th"):
                assert box(browser, th)["right"] <= right + 0.5, th.text
        finally:
            browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
