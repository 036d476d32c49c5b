/* Day-0 Portal charts: renders every element with data-chart="<kind>" from the JSON in the <script
   type="application/json"> whose id is in data-source. Uses Apache ECharts (static/vendor/echarts). */
(function () {
  "use strict";
  if (!window.echarts) { return; }

  var PALETTE = ["#2563eb", "#d97706", "#059669", "#7c3aed", "#dc2626", "#0891b2", "#65a30d", "#db2777"];
  var SYMBOLS = ["circle", "rect", "triangle", "diamond", "roundRect", "pin", "arrow", "emptyCircle"];

  function fmt(v, digits) {
    if (v === null || v === undefined || isNaN(v)) { return "–"; }
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) { return Number(v).toExponential(2); }
    return Number(v).toFixed(digits === undefined ? (a >= 100 ? 1 : 3) : digits);
  }

  function base(extra) {
    var opt = {
      color: PALETTE,
      animation: false,
      textStyle: { fontFamily: "inherit" },
      grid: { left: 16, right: 16, top: 56, bottom: 40, containLabel: true },
      legend: { top: 0, left: 0, right: 80, type: "scroll" },
      tooltip: { trigger: "axis", confine: true }
    };
    for (var k in extra) { opt[k] = extra[k]; }
    return opt;
  }

  /* Cosines of aligned layers sit within 1e-6 of 1: "1−2.0e-7" reads where 0.9999998 does not. */
  function cosineTick(v) {
    var gap = 1 - v;
    return gap > 0 && gap < 1e-3 ? "1−" + gap.toExponential(1) : fmt(v, 3);
  }

  /* Per-layer alignment: cosine (left axis) and max relative error (right axis, log) against layer index. */
  function layers(data) {
    var names = data.layers.map(function (l) { return String(l.layer); });
    return base({
      tooltip: { trigger: "axis", confine: true, valueFormatter: function (v) { return fmt(v, 6); } },
      xAxis: { type: "category", name: "layer", nameLocation: "middle", nameGap: 28, data: names },
      yAxis: [
        { type: "value", name: "cosine", scale: true, max: 1, axisLabel: { formatter: cosineTick } },
        { type: "log", name: "max rel. error", splitLine: { show: false },
          axisLabel: { formatter: function (v) { return fmt(v); } } }
      ],
      dataZoom: [{ type: "inside" }],
      series: [
        { name: "cosine", type: "line", symbol: "circle", data: data.layers.map(function (l) { return l.cosine; }),
          markLine: data.cosine_threshold ? { symbol: "none", lineStyle: { type: "dashed" },
            label: { formatter: "cosine ≥ {c}" }, data: [{ yAxis: data.cosine_threshold }] } : undefined },
        { name: "max rel. error", type: "line", yAxisIndex: 1, symbol: "triangle",
          data: data.layers.map(function (l) { return Math.max(l.max_rel_err, 1e-12); }) }
      ]
    });
  }

  /* Benchmarks against concurrency: latency percentiles (left, ms) and output tokens/s (right). */
  function bench(data) {
    var xs = data.runs.map(function (r) { return String(r.concurrency); });
    var series = [];
    data.latency.forEach(function (key, i) {
      series.push({ name: key.label, type: "line", symbol: SYMBOLS[i % SYMBOLS.length], symbolSize: 7,
        data: data.runs.map(function (r) { return r[key.field]; }) });
    });
    series.push({ name: "output tok/s", type: "bar", yAxisIndex: 1, barMaxWidth: 28, itemStyle: { opacity: 0.35 },
      data: data.runs.map(function (r) { return r.output_tok_s; }) });
    return base({
      tooltip: { trigger: "axis", confine: true, valueFormatter: function (v) { return fmt(v, 2); } },
      xAxis: { type: "category", name: "concurrency", nameLocation: "middle", nameGap: 28, data: xs },
      yAxis: [{ type: "value", name: "ms" }, { type: "value", name: "tok/s", splitLine: { show: false } }],
      series: series
    });
  }

  /* A metric over time: one line per configuration, regressions as marked points, zoom and hover. */
  function trend(data) {
    var series = data.series.map(function (s, i) {
      var flagged = s.regressions.map(function (r) {
        return { coord: [Date.parse(r.at), r.value], regression: r };
      });
      return {
        // symbols on short series: a line of one run has no segment to draw, only its point
        name: s.label, type: "line", showSymbol: s.points.length <= 31, symbol: SYMBOLS[i % SYMBOLS.length],
        sampling: "lttb",
        data: s.points,
        markPoint: { symbol: "triangle", symbolSize: 13, symbolOffset: [0, -9], label: { show: false },
          itemStyle: { color: "#b91c1c", borderColor: "#fff", borderWidth: 1 }, data: flagged,
          tooltip: { trigger: "item", formatter: function (p) {
            var r = p.data.regression;
            return "<b>▲ regression</b> " + s.label + "<br>" + r.at.slice(0, 16).replace("T", " ") + ": " + fmt(r.value) + " " +
              data.unit + "<br>baseline median " + fmt(r.baseline_median) + " (×" + fmt(r.ratio, 2) + ", z " + fmt(r.z, 1) + ")";
          } } }
      };
    });
    var changes = data.stack_changes || [];
    if (changes.length && series.length) {  // the stack's changes: dashed vertical lines on the time axis
      series[0].markLine = { symbol: "none", silent: false, lineStyle: { type: "dashed", color: "#6b7280" },
        label: { show: false },
        tooltip: { trigger: "item", formatter: function (p) { return "<b>stack change</b> " + p.data.at.slice(0, 16).replace("T", " ") + "<br>" + p.data.what; } },
        data: changes.map(function (c) { return { xAxis: Date.parse(c.at), at: c.at, what: c.label }; }) };
    }
    return base({
      grid: { left: 16, right: 24, top: 56, bottom: 48, containLabel: true },
      tooltip: { trigger: "axis", confine: true, valueFormatter: function (v) { return fmt(v) + " " + data.unit; } },
      xAxis: { type: "time", axisLabel: { hideOverlap: true } },  // a gap in the runs packs "May" and day ticks together
      yAxis: data.floor === null || data.floor === undefined ? { type: "value", name: data.unit, scale: true }
        : { type: "value", name: data.unit, min: data.floor },  // a ratio's axis from its ideal (1×, 0 %)
      dataZoom: [{ type: "inside", filterMode: "none" }, { type: "slider", filterMode: "none", height: 22, bottom: 8 }],
      toolbox: { right: 0, top: 0, itemSize: 13, feature: { dataZoom: { yAxisIndex: "none", title: { zoom: "zoom", back: "undo zoom" } }, restore: { title: "reset" } } },
      series: series
    });
  }

  /* A tier's colour from the one palette in day0.css (--tier-N-line), so bars match the tier pills. */
  function tierColour(tier) {
    var value = getComputedStyle(document.documentElement).getPropertyValue("--tier-" + tier + "-line").trim();
    return value || undefined;
  }

  /* Leaderboard: median hours from release to each tier, one bar group per hardware. */
  function leaderboard(data) {
    return base({
      tooltip: { trigger: "axis", confine: true, valueFormatter: function (v) { return v === null ? "–" : fmt(v, 1) + " h"; } },
      xAxis: { type: "category", data: data.hardware, axisLabel: { interval: 0, rotate: data.hardware.length > 6 ? 30 : 0 } },
      yAxis: { type: "value", name: "median hours" },
      series: data.tiers.map(function (t, i) {
        return { name: t.label, type: "bar", data: t.hours,
          itemStyle: { color: tierColour(t.tier), decal: { symbol: SYMBOLS[i % SYMBOLS.length] } } };
      }),
      aria: { enabled: true, decal: { show: true } }
    });
  }

  var KINDS = { layers: layers, bench: bench, trend: trend, leaderboard: leaderboard };
  var charts = [];

  function render(el) {
    var kind = KINDS[el.dataset.chart];
    var source = document.getElementById(el.dataset.source);
    if (!kind || !source) { return; }
    var chart = window.echarts.init(el, null, { renderer: "canvas" });
    chart.setOption(kind(JSON.parse(source.textContent)));
    el.setAttribute("data-rendered", "true");
    charts.push(chart);
  }

  function init() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-chart]"), render);
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () { charts.forEach(function (c) { c.resize(); }); }, 100);
    });
  }

  window.day0Charts = { charts: charts, render: render };
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", init); } else { init(); }
})();
