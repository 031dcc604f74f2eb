/* Rookery dashboard: ticking relative times, the live-link indicator, staleness (the
   page's and each value's), the rate chart (its legend showing the latest values, its
   gaps drawn as gaps).
   Fragments arrive over the page's websocket (htmx ws extension) and are swapped
   by id; this script only keeps what changes between messages up to date. */
(function () {
  "use strict";

  function relative(iso, now) {
    var seconds = (now - Date.parse(iso)) / 1000;
    var future = seconds < 0;
    var span = Math.abs(seconds);
    var text;
    if (span < 1) return "just now";
    if (span < 60) text = Math.floor(span) + " s";
    else if (span < 3600) text = Math.floor(span / 60) + " min";
    else if (span < 86400) text = Math.floor(span / 3600) + " h";
    else text = Math.floor(span / 86400) + " d";
    return future ? "in " + text : text + " ago";
  }

  /* The server's clock minus this one (ms), from the time the page was rendered
     (<body data-server-now>, epoch seconds): times from the server are compared with
     the server's "now", so a skewed client clock neither ages nor freshens them. */
  var skew = 0;

  function serverNow() {
    return Date.now() + skew;
  }

  function tickTimes() {
    var now = serverNow();
    document.querySelectorAll("time.ago[datetime]").forEach(function (el) {
      el.textContent = relative(el.getAttribute("datetime"), now);
    });
  }

  /* "N s ago" (seconds, counting) for the first two minutes, then in words */
  function ago(ms) {
    var seconds = Math.max(0, Math.floor(ms / 1000));
    return seconds < 120 ? seconds + " s ago" : relative(new Date(Date.now() - ms).toISOString(), Date.now());
  }

  /* -- staleness --------------------------------------------------------------------
     The page: its websocket closed for longer than a couple of refresh intervals (the
     slowest heartbeat among the values it shows, data-interval, 1 s if none) makes the
     banner say so, counting the seconds since the last update, and dims the values;
     fresh data after a reconnect clears it.
     A value: an element with data-fresh (ISO time of its last report) and data-interval
     (its heartbeat, s) older than VALUE_INTERVALS intervals is dimmed and says
     "last update N s ago" (.stale-note). Floors: a reconnect blip is no outage, and
     times come in whole seconds and a render or two late. */
  var PAGE_INTERVALS = 2;
  var PAGE_FLOOR_MS = 2000;
  var VALUE_INTERVALS = 3;
  var VALUE_FLOOR_MS = 3000;
  var live = { open: false, closedAt: null, lastUpdate: Date.now(), stale: false };

  function refreshInterval() {
    var slowest = 0;
    document.querySelectorAll("[data-interval]").forEach(function (el) {
      var s = parseFloat(el.dataset.interval);
      if (s > slowest) slowest = s;
    });
    return (slowest || 1) * 1000;
  }

  function pageStale(now) {
    if (live.open || live.closedAt === null) return false;
    return now - live.closedAt > Math.max(PAGE_INTERVALS * refreshInterval(), PAGE_FLOOR_MS);
  }

  function showPageStale(stale, now) {
    var banner = document.getElementById("stale-banner");
    if (!banner) return;
    var age = banner.querySelector(".stale-age");
    if (stale !== live.stale) {
      live.stale = stale;
      if (stale) {
        document.body.dataset.stale = "yes";
        /* the count ticks every second: it is not announced each time (aria-live off) */
        banner.innerHTML = "<strong>Console connection lost</strong> \u2014 values below are " +
          'stale, <span class="stale-age" aria-live="off"></span>.';
        age = banner.querySelector(".stale-age");
      } else {
        delete document.body.dataset.stale;
        banner.textContent = "";
      }
    }
    if (stale && age) age.textContent = "last update " + ago(now - live.lastUpdate);
  }

  function markStaleValues() {
    var now = serverNow();
    document.querySelectorAll("[data-fresh]").forEach(function (el) {
      var seen = Date.parse(el.dataset.fresh);
      var interval = (parseFloat(el.dataset.interval) || 1) * 1000;
      var stale = !isNaN(seen) && now - seen > Math.max(VALUE_INTERVALS * interval, VALUE_FLOOR_MS);
      var note = el.querySelector(".stale-note");
      if (!stale) {
        el.classList.remove("stale");
        if (note) note.remove();
        return;
      }
      el.classList.add("stale");
      if (!note) {
        note = document.createElement("span");
        note.className = "stale-note";
        var home = el.querySelector("[data-stale-note]") || el;
        home.appendChild(note);
      }
      note.textContent = "last update " + ago(now - seen);
    });
  }

  function tickStaleness() {
    var now = Date.now();
    showPageStale(pageStale(now), now);
    markStaleValues();
  }

  function setLiveState(state, text) {
    var el = document.getElementById("live-state");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }

  function opened() {
    live.open = true;
    live.closedAt = null;
    setLiveState("open", "live");
    /* the banner stays until fresh data arrives (the message the server sends on connect) */
  }

  /* -- reconnecting -------------------------------------------------------------------
     The page is live again within a second or so of the console answering, after an
     outage of any length. While the console is away the page asks its /healthz, every
     0.25-0.5 s, and opens the websocket again only once that answers: a browser delays
     each new websocket by up to seconds after many failed ones (Chromium's per-process
     throttle), so failing websockets every half second through a long outage would
     make the first one after it wait 1-5 s. The ws extension's own retries are
     therefore pushed out of the way (a day), and this code reconnects every close but
     4401 (logged out) and 4404 (no such page), which need a reload, not a retry. */
  var NOT_RETRIED = [4401, 4404];
  var probing = false;

  function retryDelay() {
    return 250 + Math.random() * 250;
  }

  if (window.htmx) htmx.config.wsReconnectDelay = function () { return 24 * 3600 * 1000; };

  function connectAgain() {
    var link = document.getElementById("live-link");
    if (!link || live.open || !window.htmx) return;
    var fresh = link.cloneNode(false);
    link.replaceWith(fresh);
    htmx.process(fresh);
  }

  function probe() {
    if (live.open) { probing = false; return; }
    fetch("/healthz", { cache: "no-store", credentials: "same-origin" })
      .then(function (reply) {
        if (!reply.ok) throw new Error("not ready");
        probing = false;
        connectAgain();
      })
      .catch(function () { setTimeout(probe, retryDelay()); });
  }

  function reconnect(evt) {
    var event = evt && evt.detail && evt.detail.event;
    var code = event && event.code;
    if (NOT_RETRIED.indexOf(code) >= 0 || probing) return;
    probing = true;
    setTimeout(probe, retryDelay());
  }

  function closed(evt) {
    if (live.open || live.closedAt === null) live.closedAt = Date.now();
    live.open = false;
    setLiveState("closed", "reconnecting");
    tickStaleness();
    if (evt && evt.type === "htmx:wsClose") reconnect(evt);
  }

  function updated() {
    live.lastUpdate = Date.now();
    if (live.open) showPageStale(false, live.lastUpdate);
    tickTimes();
    markStaleValues();
  }

  var chart = null;

  /* uPlot's legend shows values under the cursor, and "--" when there is none: show the
     latest point instead whenever the cursor is off the chart. */
  function latestLegend(u) {
    if (u._rookeryLatest || u.cursor.idx != null) return;
    var xs = u.data && u.data[0];
    if (!xs || !xs.length) return;
    u._rookeryLatest = true;
    try { u.setLegend({ idx: xs.length - 1 }); } finally { u._rookeryLatest = false; }
  }

  /* A time axis for x values in seconds. A single x value (the first live sample, a
     one-minute report) is widened by uPlot by 86400 / ms before the range hook (1,000
     days for seconds), so look at the data: one value gets a minute either side. */
  function timeRange(u, min, max) {
    var xs = u.data[0];
    return xs.length && xs[0] === xs[xs.length - 1] ? [xs[0] - 60, xs[0] + 60] : [min, max];
  }

  /* uPlot data [xs, ys...] with a null point wherever consecutive x values are further
     apart than `maxGap` (default: twice the smallest step between points), and one at
     `until` (a time in x units) if the last point is older than that: uPlot breaks a
     line at nulls (spanGaps false), so an outage shows as a gap, never a straight line.
     Points that already are null (a missing sample) stay null. */
  function withGaps(data, maxGap, until) {
    var xs = data[0];
    if (!xs || !xs.length) return data;
    var step = Infinity;
    for (var i = 1; i < xs.length; i++) {
      var d = xs[i] - xs[i - 1];
      if (d > 0 && d < step) step = d;
    }
    if (!isFinite(step)) step = 1;
    var limit = maxGap || 2 * step;
    var out = data.map(function () { return []; });
    function push(at, values) {
      out[0].push(at);
      for (var k = 1; k < data.length; k++) out[k].push(values ? values[k] : null);
    }
    for (var j = 0; j < xs.length; j++) {
      if (j > 0 && xs[j] - xs[j - 1] > limit) push(xs[j - 1] + step, null);
      push(xs[j], data.map(function (series) { return series[j]; }));
    }
    var last = xs[xs.length - 1];
    if (until != null && until - last > limit + step) push(until, null);
    return out;
  }

  var RATE_SERIES = [
    {},
    { label: "published/s", stroke: "#2f5d9f", width: 2, spanGaps: false },
    { label: "routed/s", stroke: "#8a5a00", width: 2, dash: [6, 4], spanGaps: false },
    { label: "delivered/s", stroke: "#1b7f3b", width: 2, spanGaps: false }
  ];

  window.RookeryCharts = {
    latestLegend: latestLegend,
    timeRange: timeRange,
    withGaps: withGaps,
    chart: function () { return chart; }
  };

  function rateSeries() {
    var el = document.getElementById("rate-series");
    if (!el) return null;
    try {
      var data = JSON.parse(el.textContent);
      /* the series ends a bucket before the one filling now (charts.py) */
      return withGaps([data.t, data.published, data.routed, data.delivered], null,
        Math.floor(serverNow() / 1000));
    } catch (err) {
      return null;
    }
  }

  function chartWidth(box) {
    return Math.max(240, box.clientWidth - 8);
  }

  function drawChart() {
    var box = document.getElementById("rate-chart");
    var data = rateSeries();
    if (!box || !data || typeof uPlot === "undefined") return;
    if (chart) {
      chart.setData(data);
      latestLegend(chart);
      return;
    }
    chart = new uPlot({
      width: chartWidth(box),
      height: 220,
      scales: { x: { time: true, range: timeRange }, y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      series: RATE_SERIES,
      axes: [{}, { label: "messages/s" }],
      hooks: { ready: [latestLegend], setLegend: [latestLegend] }
    }, data, box);
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        chart.setSize({ width: chartWidth(box), height: 220 });
      }).observe(box);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var rendered = parseFloat(document.body.dataset.serverNow);
    if (!isNaN(rendered)) skew = rendered * 1000 - Date.now();
    /* the page shows what the server rendered just now: its last update */
    live.lastUpdate = Date.now();
    if (document.getElementById("live-link")) live.closedAt = Date.now();  /* not open yet */
    tickTimes();
    markStaleValues();
    drawChart();
    setInterval(function () { tickTimes(); tickStaleness(); }, 1000);
  });
  document.addEventListener("htmx:wsOpen", opened);
  document.addEventListener("htmx:wsClose", closed);
  document.addEventListener("htmx:wsError", closed);
  document.addEventListener("htmx:wsAfterMessage", function () {
    updated();
    drawChart();
    document.body.dataset.liveUpdates = String(Number(document.body.dataset.liveUpdates || 0) + 1);
  });
})();
