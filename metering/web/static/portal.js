// Draws each report chart from the JSON beside it (the table on the page has every number).
(function () {
  "use strict";
  var COLOURS = ["#0b5394", "#e69138", "#38761d", "#990000", "#674ea7", "#45818e", "#bf9000",
                 "#a64d79", "#3d85c6", "#6aa84f", "#cc4125", "#5b5b5b"];
  function usd(microcents) { return "$" + (microcents / 1e8).toFixed(microcents % 1e6 ? 8 : 2); }
  function draw(canvas) {
    var source = document.getElementById(canvas.getAttribute("data-chart"));
    if (!source || typeof Chart === "undefined") { return; }
    var data = JSON.parse(source.textContent);
    var money = data.unit === "usd";
    var chart = new Chart(canvas, {
      type: "bar",
      data: {
        labels: data.labels.map(function (label) { return label.replace(":00:00Z", "h").replace("T00h", ""); }),
        datasets: data.datasets.map(function (set, index) {
          return { label: set.label, data: set.data.map(function (v) { return money ? v / 1e8 : v; }),
                   backgroundColor: COLOURS[index % COLOURS.length] };
        })
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true,
          ticks: { callback: function (v) { return money ? "$" + v : v; } } } },
        plugins: { tooltip: { callbacks: { label: function (item) {
          var raw = data.datasets[item.datasetIndex].data[item.dataIndex];
          return item.dataset.label + ": " + (money ? usd(raw) : raw);
        } } } }
      }
    });
    canvas.setAttribute("data-drawn", String(chart.data.datasets.length));
  }
  document.querySelectorAll("canvas[data-chart]").forEach(draw);
})();
