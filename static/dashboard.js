/* Rookery dashboard: ticking relative times, the live-link indicator, the rate chart
   (its legend showing the latest values).
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

  function tickTimes() {
    var now = Date.now();
    document.querySelectorAll("time.ago[datetime]").forEach(function (el) {
      el.textContent = relative(el.getAttribute("datetime"), now);
    });
  }

  function setLiveState(state, text) {
    var el = document.getElementById("live-state");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
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
  window.RookeryCharts = { latestLegend: latestLegend, timeRange: timeRange };

  function rateSeries() {
    var el = document.getElementById("rate-series");
    if (!el) return null;
    try {
      var data = JSON.parse(el.textContent);
      return [data.t, data.published, data.routed, data.delivered];
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
      series: [
        {},
        { label: "published/s", stroke: "#2f5d9f", width: 2 },
        { label: "routed/s", stroke: "#8a5a00", width: 2, dash: [6, 4] },
        { label: "delivered/s", stroke: "#1b7f3b", width: 2 }
      ],
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
    tickTimes();
    drawChart();
    setInterval(tickTimes, 1000);
  });
  document.addEventListener("htmx:wsOpen", function () { setLiveState("open", "live"); });
  document.addEventListener("htmx:wsClose", function () { setLiveState("closed", "reconnecting"); });
  document.addEventListener("htmx:wsError", function () { setLiveState("closed", "reconnecting"); });
  document.addEventListener("htmx:wsAfterMessage", function () {
    tickTimes();
    drawChart();
    document.body.dataset.liveUpdates = String(Number(document.body.dataset.liveUpdates || 0) + 1);
  });
})();
