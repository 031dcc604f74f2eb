/* Rookery report page: the two uPlot charts of one report run, drawn from the
   JSON the page carries (#report-series, built by clusterapi.reports.chart_series). */
(function () {
  "use strict";

  var PALETTE = ["#2f5d9f", "#8a5a00", "#1b7f3b", "#a3308f", "#c0392b", "#16808a",
                 "#6b4fbb", "#5d6d1e", "#b35c00", "#35506b", "#7a2e2e", "#2e7a62"];

  function width(box) {
    return Math.max(240, box.clientWidth - 8);
  }

  function draw(id, series, data) {
    var box = document.getElementById(id);
    if (!box || !data[0].length) {
      if (box) box.textContent = "No data for this chart.";
      return;
    }
    /* a minute with no samples breaks the lines (never a straight line across an outage) */
    if (window.RookeryCharts) data = RookeryCharts.withGaps(data, 120);
    series = series.map(function (s) { s.spanGaps = false; return s; });
    var chart = new uPlot({
      width: width(box),
      height: 240,
      // one minute alone is shown with a minute either side (dashboard.js's timeRange)
      scales: {
        x: { time: true, range: window.RookeryCharts ? RookeryCharts.timeRange : null },
        y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } }
      },
      series: [{}].concat(series),
      axes: [{}, { label: "messages/s" }],
      hooks: window.RookeryCharts
        ? { ready: [RookeryCharts.latestLegend], setLegend: [RookeryCharts.latestLegend] }
        : {}
    }, data, box);
    box.uplot = chart;  // for the browser tests (and a console): its scales and data
    if (window.ResizeObserver) {
      new ResizeObserver(function () { chart.setSize({ width: width(box), height: 240 }); }).observe(box);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var el = document.getElementById("report-series");
    if (!el || typeof uPlot === "undefined") return;
    var data = JSON.parse(el.textContent);
    var cluster = data.cluster;
    draw("report-isr-xsr", [
      { label: "ISR (routed into queues)/s", stroke: "#8a5a00", width: 2 },
      { label: "XSR (delivered to clients)/s", stroke: "#1b7f3b", width: 2 }
    ], [cluster.t, cluster.isr, cluster.xsr]);
    var brokers = data.brokers;
    draw("report-brokers", brokers.names.map(function (name, i) {
      return { label: name, stroke: PALETTE[i % PALETTE.length], width: 1.5 };
    }), [brokers.t].concat(brokers.in));
  });
})();
