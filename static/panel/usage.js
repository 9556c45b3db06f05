// The usage page's chart (issue 17.2): seconds each model was held, per hour, one line per
// model, from the rows the page embeds (#usage-hourly). The table and the CSV need no script.
(function () {
  "use strict";
  var source = document.getElementById("usage-hourly");
  var target = document.getElementById("usage-chart");
  if (!source || !target || typeof uPlot === "undefined") return;
  var rows = JSON.parse(source.textContent);
  if (!rows.length) return;
  var hours = [], models = [], values = {};
  rows.forEach(function (row) {
    var t = Date.parse(row.hour) / 1000;
    if (hours.indexOf(t) < 0) hours.push(t);
    if (models.indexOf(row.model) < 0) models.push(row.model);
    values[row.model + "\u0000" + t] = row.model_seconds;
  });
  hours.sort(function (a, b) { return a - b; });
  var data = [hours];
  var series = [{}];
  var palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"];
  models.forEach(function (model, i) {
    data.push(hours.map(function (t) { return values[model + "\u0000" + t] || 0; }));
    series.push({ label: model, stroke: palette[i % palette.length], width: 2,
                  points: { show: true } });
  });
  // The x-axis spans the days asked for (#usage-window), not uPlot's guess around a few hours;
  // axes and grid in the theme's colours (panel.css), drawn again when the theme changes.
  var span = JSON.parse(document.getElementById("usage-window").textContent);
  function ink(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }
  function axis(extra) {
    var line = { stroke: ink("--chart-grid") };
    return Object.assign({ stroke: ink("--chart-axis"), grid: line, ticks: line }, extra);
  }
  function draw() {
    if (window.panelUsageChart) window.panelUsageChart.destroy();
    var width = Math.max(280, target.clientWidth || 800);
    window.panelUsageChart = new uPlot({
      width: width, height: 260, series: series,
      scales: { x: { time: true, range: function () { return span; } } },
      axes: [axis({}), axis({ label: "seconds", size: 56 })],
    }, data, target);
  }
  draw();
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", draw);
})();
