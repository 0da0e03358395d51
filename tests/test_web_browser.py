"""The dashboard in a real browser (Debian's chromium + chromium-driver, driven
by selenium; scripts/system-deps.sh installs them): click from the overview into a queue,
open a failed job, press Retry and see the state change in the page and in Redis; live
updates without a reload; hostile names and payloads render as text (no alert, no
injected element); read-only mode has no action buttons. Screenshots of every page at
1280x800 and 390x844 go to $EMQ_TEST_ARTIFACTS (default: a temp dir), to look at."""
from __future__ import annotations

import base64
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver")
import uvicorn  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException, NoSuchElementException, StaleElementReferenceException)
from selenium.webdriver.common.by import By  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from test_web_pages import XSS_IMG, fill  # noqa: E402
from waiting import wait_until  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    if os.environ.get("CI"):
        raise RuntimeError("chromium/chromedriver missing: scripts/system-deps.sh installs them")
    pytest.skip("chromium and chromium-driver are not installed (scripts/system-deps.sh)",
                allow_module_level=True)

ARTIFACTS = Path(os.environ.get("EMQ_TEST_ARTIFACTS")
                 or Path(tempfile.gettempdir()) / "emqfast-web-screens")
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
XSS_RUN = "<script>window.__xss = 1</script>"
XSS_ONERROR = '"><img src=x id=injected onerror="window.__xss = 2">'


def text_of(browser, by, selector) -> str:
    """An element's text, or "" while the page is between renders.

    A click that posts a form reloads the page: an element found just before the reload
    goes stale, and the next page may not have drawn it yet. Polls read it afresh.
    """
    try:
        return browser.find_element(by, selector).text
    except (StaleElementReferenceException, NoSuchElementException):
        return ""


class LiveServer:
    """The app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        wait_until(lambda: self.server.started, what="uvicorn to start")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="emq-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--window-size=1280,800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER),
                              options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shoot(driver, name: str) -> None:
    """Screenshots of the current page at each window size: what the window shows
    (``-desktop``, ``-phone``) and the whole page down to 3,000 px (``-full``)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for size, (w, h) in SIZES.items():
        # the exact viewport, as a phone has it (a headless window has a minimum width)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": w, "height": h, "deviceScaleFactor": 1, "mobile": size == "phone"})
        driver.save_screenshot(str(ARTIFACTS / f"{name}-{size}.png"))
        height = min(driver.execute_script("return document.documentElement.scrollHeight"), 3000)
        width = driver.execute_script("return document.documentElement.scrollWidth")
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
        (ARTIFACTS / f"{name}-{size}-full.png").write_bytes(base64.b64decode(shot["data"]))
        assert width <= w, f"{name} is wider ({width} px) than a {w} px window"
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def no_alert(driver) -> bool:
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def test_click_into_a_failed_job_and_retry_it(browser, redis_url, conn, qname):
    ids = fill(conn, qname)
    with LiveServer(create_app(redis_url, queues=[qname])) as live:
        browser.get(live.url + "/")
        shoot(browser, "overview")
        browser.find_element(By.LINK_TEXT, qname).click()
        wait_until(lambda: "queue" in browser.title.lower() or qname in browser.title)
        shoot(browser, "queue")
        browser.find_element(By.PARTIAL_LINK_TEXT, "failed").click()
        browser.find_element(By.LINK_TEXT, ids["failed"]).click()
        state = browser.find_element(By.CSS_SELECTOR, "[data-job-state]")
        assert state.text == "failed"
        shoot(browser, "job-failed")
        browser.find_element(By.XPATH, "//button[normalize-space()='Retry']").click()
        wait_until(lambda: text_of(browser, By.CSS_SELECTOR, "[data-job-state]")
                   == "pending", what="the page to show the retried job as pending")
        assert "pending again" in browser.find_element(By.CSS_SELECTOR, ".flash").text
        assert emqfast.Queue(qname, conn).get(ids["failed"]).state == "pending"
        browser.get(live.url + "/schedules")
        shoot(browser, "schedules")
        emqfast.Leaderboard(conn, qname).set_many({"ada": 92, "alan": 89, "grace": 87})
        browser.get(live.url + "/leaderboards")
        shoot(browser, "leaderboards")


def test_the_overview_updates_live_without_a_reload(browser, redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    q.enqueue({"n": 0})
    with LiveServer(create_app(redis_url, queues=[qname])) as live:
        browser.get(live.url + "/")
        browser.execute_script("window.__same_page = true")
        cell = f'tr[data-q="{qname}"] td[data-k="pending"]'
        assert browser.find_element(By.CSS_SELECTOR, cell).text == "1"
        q.enqueue_many([{"n": i} for i in range(4)])
        wait_until(lambda: text_of(browser, By.CSS_SELECTOR, cell) == "5",
                   what="the pending count to update in place")
        emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
        wait_until(lambda: text_of(browser, By.ID, "chart-peak") not in ("", "0.0"),
                   what="the throughput chart to draw the finished jobs")
        assert browser.find_element(By.ID, "chart-done").get_attribute("d").startswith("M")
        assert browser.find_element(By.CSS_SELECTOR, cell).text == "0"
        assert browser.execute_script("return window.__same_page") is True  # no reload
        shoot(browser, "overview-live")


def test_hostile_names_and_payloads_render_as_text(browser, redis_url, conn):
    q = emqfast.Queue("xss" + XSS_ONERROR, conn)
    job_id = "JOB" + XSS_RUN
    q.enqueue({"html": XSS_RUN, "img": XSS_ONERROR}, job_id=job_id)
    failing = "JOBf" + XSS_ONERROR
    q.enqueue({"fail": True, "why": XSS_RUN + XSS_IMG}, job_id=failing, attempts=1)
    from test_web_pages import handler
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    with LiveServer(create_app(redis_url, queues=[q.name])) as live:
        browser.get(live.url + "/")
        browser.find_element(By.LINK_TEXT, q.name).click()
        browser.find_element(By.PARTIAL_LINK_TEXT, "failed").click()
        shoot(browser, "xss-queue")
        browser.find_element(By.LINK_TEXT, failing).click()
        assert XSS_RUN in browser.find_element(By.ID, "error").text
        shoot(browser, "xss-job")
        for page in (live.url + "/", browser.current_url):
            browser.get(page)
            assert no_alert(browser)
            assert browser.execute_script("return window.__xss") is None
            assert browser.find_elements(By.ID, "injected") == []
            assert browser.find_elements(By.CSS_SELECTOR, "img") == []


def test_read_only_has_no_action_buttons(browser, redis_url, conn, qname):
    ids = fill(conn, qname)
    with LiveServer(create_app(redis_url, queues=[qname], read_only=True)) as live:
        for path in (f"/queue?q={qname}&state=failed", f"/job?q={qname}&id={ids['failed']}",
                     "/schedules"):
            browser.get(live.url + path)
            assert "read-only" in browser.find_element(By.TAG_NAME, "header").text
            buttons = [b.text for b in browser.find_elements(By.CSS_SELECTOR, "main button")]
            # Find, and the live-update toggle (a type=button: it posts nothing)
            assert set(buttons) <= {"Find", "Pause live updates"}, buttons
            assert browser.find_elements(By.CSS_SELECTOR, "form[method=post]") == []
        shoot(browser, "read-only-schedules")  # the last page the loop opened


def test_workers_page_lists_a_live_worker(browser, redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    q.enqueue({"n": 1})
    hold, started = threading.Event(), threading.Event()

    def slow(job):
        started.set()
        hold.wait(20)
    w = emqfast.Worker(q, slow, concurrency=4)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(started.is_set, what="the handler to start")
        with LiveServer(create_app(redis_url, queues=[qname])) as live:
            def listed():
                browser.get(live.url + "/workers")
                return w.name in browser.find_element(By.TAG_NAME, "main").text
            wait_until(listed, what="the worker on the Workers page")
            shoot(browser, "workers")
    finally:
        hold.set()
        w.stop()
        t.join(30)
