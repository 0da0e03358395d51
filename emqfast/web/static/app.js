// emqfast dashboard: live updates by short polling of the page's JSON endpoint, and
// confirmations for destructive forms. Text is only ever set with textContent; a list
// that changed (a new queue, other jobs on this page of a list) is replaced by the same
// region of this very page fetched again (server-rendered, escaped; the CSP forbids inline
// script), keeping the page's place: its address, the boxes ticked, the scroll position.
(function () {
  "use strict";
  var POLL_MS = 2000;
  var PAUSE_KEY = "emq-live-paused";
  var paused = false;
  var refreshing = false;

  function setText(el, value) {
    if (el && el.textContent !== String(value)) { el.textContent = String(value); }
  }

  function badge(paused) {
    var span = document.createElement("span");
    span.className = "badge " + (paused ? "paused" : "live");
    span.textContent = paused ? "paused" : "running";
    return span;
  }

  function updateOverview(data) {
    var rows = {};
    data.rows.forEach(function (r) { rows[r.name] = r; });
    document.querySelectorAll("#queues tbody tr").forEach(function (tr) {
      var r = rows[tr.dataset.q];
      if (!r || r.error) { return; }
      tr.querySelectorAll("td[data-k]").forEach(function (td) {
        var k = td.dataset.k;
        if (k === "paused") {
          var want = r.paused ? "paused" : "running";
          if (td.textContent.trim() !== want) { td.replaceChildren(badge(r.paused)); }
        } else if (k === "rate_limit") { setText(td, r.rate_limit); }
        else if (k === "done_min") { setText(td, r.per_min[0]); }
        else if (k === "failed_min") { setText(td, r.per_min[1]); }
        else if (k in r.counts) {
          setText(td, r.counts[k]);
          if (k === "failed") { td.classList.toggle("bad", r.counts[k] > 0); }
        }
      });
    });
    setText(document.getElementById("queue-count"), "(" + data.rows.length + ")");
    var shown = [];
    document.querySelectorAll("#queues tbody tr[data-q]").forEach(function (tr) {
      shown.push(tr.dataset.q);
    });
    var names = data.rows.map(function (r) { return r.name; });
    if (shown.join("\n") !== names.join("\n")) { refreshLive(); }
    var done = document.getElementById("chart-done");
    var failed = document.getElementById("chart-failed");
    if (done) { done.setAttribute("d", data.chart.done); }
    if (failed) { failed.setAttribute("d", data.chart.failed); }
    setText(document.getElementById("chart-peak"), data.chart.peak.toFixed(1));
    if (data.chart.points >= 2) { setText(document.getElementById("chart-note"), ""); }
  }

  function updateQueue(data) {
    Object.keys(data.counts).forEach(function (state) {
      document.querySelectorAll("[data-count]").forEach(function (el) {
        if (el.dataset.count === state) { setText(el, data.counts[state]); }
      });
    });
    var region = document.getElementById("jobs-live");
    if (region && data.ids) {
      var shown = [];
      region.querySelectorAll("tr[data-id]").forEach(function (tr) { shown.push(tr.dataset.id); });
      if (shown.join("\n") !== data.ids.join("\n")) { refreshLive(); }
    }
    var flag = document.getElementById("paused-flag");
    if (flag) {
      var want = data.paused ? "paused" : "running";
      if (flag.textContent.trim() !== want) { flag.replaceChildren(badge(data.paused)); }
    }
  }

  function updateJob(data) {
    var el = document.querySelector("[data-job-state]");
    if (!el) { return; }
    if (el.textContent.trim() !== data.state) {
      el.textContent = data.state;
      el.className = "badge st-" + data.state;
      var note = document.getElementById("state-note");
      if (note) { note.hidden = false; }
    }
  }

  // Replace each [data-live] region by its fresh copy from this page's own address.
  function refreshLive() {
    if (refreshing) { return; }
    refreshing = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text || paused) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (region) {
          var next = fresh.getElementById(region.id);
          if (next) { swap(region, next); }
        });
      })
      .catch(function () { /* the next change tries again */ })
      .then(function () { refreshing = false; });
  }

  function swap(region, next) {
    var active = document.activeElement;
    if (active && region.contains(active) && active.matches("input[type=text], input:not([type])")) {
      return;  // someone is typing in it: later
    }
    var ticked = {};
    region.querySelectorAll("input[name=ids]:checked").forEach(function (c) { ticked[c.value] = true; });
    var copy = document.importNode(next, true);
    copy.querySelectorAll("input[name=ids]").forEach(function (c) { c.checked = !!ticked[c.value]; });
    var x = window.scrollX, y = window.scrollY;
    region.replaceWith(copy);
    window.scrollTo(x, y);
    confirmations(copy); selectAll(copy);
  }

  function livePause() {
    try { paused = window.sessionStorage.getItem(PAUSE_KEY) === "1"; } catch (e) { paused = false; }
    document.querySelectorAll("[data-live-toggle]").forEach(function (button) {
      function show() {
        button.textContent = paused ? "Resume live updates" : "Pause live updates";
        button.setAttribute("aria-pressed", paused ? "true" : "false");
      }
      show();
      button.addEventListener("click", function () {
        paused = !paused;
        try { window.sessionStorage.setItem(PAUSE_KEY, paused ? "1" : "0"); } catch (e) { /* */ }
        show();
      });
    });
  }

  var UPDATERS = { overview: updateOverview, queue: updateQueue, job: updateJob };

  function poll() {
    var url = document.body.dataset.poll;
    var update = UPDATERS[document.body.dataset.page];
    if (!url || !update) { return; }
    function tick() {
      if (document.hidden || paused) { return; }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) { if (data) { update(data); } })
        .catch(function () { /* the next tick tries again */ });
    }
    window.setInterval(tick, POLL_MS);
  }

  function confirmations(root) {
    (root || document).querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        if (!window.confirm(form.dataset.confirm)) { ev.preventDefault(); }
      });
    });
  }

  function selectAll(root) {
    (root || document).querySelectorAll("[data-select-all]").forEach(function (box) {
      box.addEventListener("change", function () {
        var form = box.closest("form");
        form.querySelectorAll("input[name=ids]").forEach(function (c) { c.checked = box.checked; });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    livePause(); poll(); confirmations(); selectAll();
  });
})();
