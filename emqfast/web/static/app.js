// emqfast dashboard: live updates by short polling of the page's JSON endpoint, and
// confirmations for destructive forms. Text is only ever set with textContent.
(function () {
  "use strict";
  var POLL_MS = 2000;

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

  var UPDATERS = { overview: updateOverview, queue: updateQueue, job: updateJob };

  function poll() {
    var url = document.body.dataset.poll;
    var update = UPDATERS[document.body.dataset.page];
    if (!url || !update) { return; }
    function tick() {
      if (document.hidden) { return; }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) { if (data) { update(data); } })
        .catch(function () { /* the next tick tries again */ });
    }
    window.setInterval(tick, POLL_MS);
  }

  function confirmations() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (ev) {
        if (!window.confirm(form.dataset.confirm)) { ev.preventDefault(); }
      });
    });
  }

  function selectAll() {
    document.querySelectorAll("[data-select-all]").forEach(function (box) {
      box.addEventListener("change", function () {
        var form = box.closest("form");
        form.querySelectorAll("input[name=ids]").forEach(function (c) { c.checked = box.checked; });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    poll(); confirmations(); selectAll();
  });
})();
