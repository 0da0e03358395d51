"""The Workers page with a live process Worker in Chromium: its children under its row,
at desktop and phone widths (screenshots in the artifacts directory)."""
from __future__ import annotations

import threading

import emqfast
from emqfast.facade.workers import QueueWorkers
from emqfast.web import create_app
from procobs_handlers import handle
from test_web_browser import LiveServer, browser, shoot  # noqa: F401 - browser: a fixture
from waiting import wait_until
from selenium.webdriver.common.by import By


def test_workers_page_shows_a_process_workers_children(browser, redis_url, conn,  # noqa: F811
                                                         qname, tmp_path):
    q = emqfast.Queue(qname, conn)
    job = q.enqueue({"k": "nap", "s": 30, "mark": str(tmp_path / "began")})
    w = emqfast.Worker(q, handle, processes=3, shutdown_timeout_s=0.5)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(lambda: any(c.held for i in QueueWorkers(q).list() for c in i.children),
                   30, "the job in a child, in the heartbeat")
        with LiveServer(create_app(redis_url, queues=[qname])) as live:
            browser.get(live.url + "/workers")
            main = browser.find_element(By.TAG_NAME, "main")
            assert w.name in main.text and job.id in main.text
            subs = browser.find_elements(By.CSS_SELECTOR, "table.sub tbody tr")
            assert len(subs) == 3, main.text
            link = browser.find_element(By.LINK_TEXT, job.id)
            assert link.get_attribute("href").endswith(f"/job?q={qname}&id={job.id}")
            shoot(browser, "workers-processes")
    finally:
        w.stop()
        t.join(30)
