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
  var width = Math.max(320, target.clientWidth || 800);
  new uPlot({ width: width, height: 260, series: series,
              axes: [{}, { label: "seconds" }] }, data, target);
})();
