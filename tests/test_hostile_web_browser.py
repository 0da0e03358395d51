"""The dashboard against hostile pages in a real browser (Chromium): a name rebound to
127.0.0.1 (``evil.example``, mapped by Chromium's host resolver rules as a rebinding
attack leaves it) reads nothing; a page on another port of the same host that plants
the CSRF cookie and posts its value changes nothing; the dashboard's own buttons still
work (their POSTs are same-origin)."""
from __future__ import annotations

import shutil
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_web_browser import CHROMIUM, DRIVER, LiveServer, text_of, webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from waiting import wait_until  # noqa: E402

PLANTED = "planted-by-another-port"


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="emq-chromium-hostile-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-dev-shm-usage",
                "--host-resolver-rules=MAP evil.example 127.0.0.1",
                f"--user-data-dir={profile}", "--window-size=1280,800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER),
                              options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


class Attacker:
    """A page on another port of 127.0.0.1 serving ``html`` (no CSP: it is the attacker's)."""

    def __init__(self, html: str):
        body = html.encode()

        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Attacker":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].strip("/"))


def test_a_rebound_name_reads_nothing(browser, redis_url, conn, qname):
    emqfast.Queue(qname, conn).enqueue({"n": 1})
    with LiveServer(create_app(redis_url)) as live:
        rebound = f"http://evil.example:{_port(live.url)}"
        for path in ("/", "/api/overview", f"/queue?q={qname}"):
            browser.get(rebound + path)
            body = browser.find_element(By.TAG_NAME, "body").text
            assert qname not in body and "does not answer that Host" in body, body
        browser.get(live.url + "/")  # the real address still works
        assert qname in browser.find_element(By.TAG_NAME, "body").text


def test_a_page_on_another_port_cannot_plant_the_csrf_cookie(browser, redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    q.enqueue({"n": 1})
    with LiveServer(create_app(redis_url)) as live:
        html = f"""<!doctype html><body>
<form id="f" method="post" action="{live.url}/queue/action">
<input name="q" value="{qname}"><input name="action" value="pause">
<input name="csrf" value="{PLANTED}"></form>
<script>document.cookie = "emq_csrf={PLANTED}; path=/";
document.getElementById("f").submit();</script></body>"""
        with Attacker(html) as attacker:
            browser.delete_all_cookies()
            browser.get(attacker.url)
            wait_until(lambda: browser.current_url.startswith(live.url),
                       what="the attacker's form to post to the dashboard")
            wait_until(lambda: "Back to the queues" in text_of(browser, By.TAG_NAME, "body")
                       or "paused" in text_of(browser, By.TAG_NAME, "body"),
                       what="the dashboard's answer (an error page, or the paused queue)")
        assert not q.is_paused(), text_of(browser, By.TAG_NAME, "body")
        assert "another site" in text_of(browser, By.TAG_NAME, "body")
        # the dashboard's own Pause button still works in this browser
        browser.get(f"{live.url}/queue?q={qname}")
        browser.find_element(By.XPATH, "//button[normalize-space()='Pause']").click()
        wait_until(q.is_paused, what="the queue to be paused by its own button")

