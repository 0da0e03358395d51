"""Lists refresh live in the browser (headless Chromium): a new queue shows up on the
overview and new jobs in a queue's list without a reload, keeping the page's place (its
address, ticked boxes, scroll position); the refresh can be paused and resumed."""
from __future__ import annotations

import time


import test_web_browser
from test_web_browser import LiveServer, text_of
from selenium.webdriver.common.by import By  # noqa: E402

import emqfast  # noqa: E402
from emqfast.web import create_app  # noqa: E402
from waiting import wait_until  # noqa: E402

browser = test_web_browser.browser  # the module's Chromium (a fixture)


def fail(job):
    raise RuntimeError("boom")


def row_ids(driver) -> list:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#jobs-live tr[data-id]'))"
        ".map(function (tr) { return tr.dataset.id; })")


def test_a_new_queue_shows_up_on_the_overview_without_a_reload(browser, redis_url, conn,
                                                               qname):
    emqfast.Queue(qname, conn).enqueue({"n": 1})
    with LiveServer(create_app(redis_url)) as live:
        browser.get(live.url + "/")
        browser.execute_script("window.__same_page = true")
        assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-q="{qname}-new"]') == []
        emqfast.Queue(qname + "-new", conn).enqueue({"n": 2})
        wait_until(lambda: text_of(browser, By.CSS_SELECTOR,
                                   f'tr[data-q="{qname}-new"] td[data-k="pending"]') == "1",
                   timeout=20, what="the new queue's row on the overview")
        assert browser.execute_script("return window.__same_page") is True  # no reload
        # the new row is a working link
        link = browser.find_element(By.LINK_TEXT, qname + "-new")
        assert link.get_attribute("href").endswith(f"/queue?q={qname}-new")


def test_the_job_list_refreshes_in_place_and_can_be_paused(browser, redis_url, conn, qname):
    q = emqfast.Queue(qname, conn)
    for i in range(3):
        q.enqueue({"n": i}, attempts=1)
    emqfast.Worker(q, fail).run_until_idle(timeout_s=30)
    with LiveServer(create_app(redis_url, queues=[qname])) as live:
        address = f"{live.url}/queue?q={qname}&state=failed"
        browser.get(address)
        browser.execute_script("window.sessionStorage.clear(); window.__same_page = true")
        first = row_ids(browser)
        assert len(first) == 3
        ticked = browser.find_element(By.CSS_SELECTOR, f'input[name=ids][value="{first[1]}"]')
        ticked.click()
        browser.execute_script("window.scrollTo(0, 120)")
        y = browser.execute_script("return window.scrollY")
        newer = q.enqueue({"n": 9}, attempts=1)
        emqfast.Worker(q, fail).run_until_idle(timeout_s=30)
        wait_until(lambda: newer.id in row_ids(browser), timeout=15,
                   what="the new failed job in the list")
        assert browser.execute_script("return window.__same_page") is True
        assert browser.current_url == address
        box = browser.find_element(By.CSS_SELECTOR, f'input[name=ids][value="{first[1]}"]')
        assert box.is_selected()  # the ticked box stays ticked
        assert browser.execute_script("return window.scrollY") == y
        # paused: nothing changes until resumed
        toggle = browser.find_element(By.CSS_SELECTOR, "[data-live-toggle]")
        assert toggle.text == "Pause live updates"
        toggle.click()
        assert toggle.text == "Resume live updates"
        held = q.enqueue({"n": 10}, attempts=1)
        emqfast.Worker(q, fail).run_until_idle(timeout_s=30)
        time.sleep(5)  # two and a half poll periods
        assert held.id not in row_ids(browser)
        toggle.click()
        wait_until(lambda: held.id in row_ids(browser), timeout=15,
                   what="the list to refresh once resumed")
        # a row that came in live works: its Retry posts (its form and CSRF token came along)
        browser.find_element(
            By.XPATH, f"//tr[@data-id='{held.id}']//button[normalize-space()='Retry']").click()
        wait_until(lambda: "pending again" in text_of(browser, By.CSS_SELECTOR, ".flash"),
                   what="the retry of a row that came in live")
        assert q.get(held.id).state == "pending"
