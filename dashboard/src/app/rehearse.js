/* Drawing the rehearsal chart (lib/rehearsal.js): once, off screen and hidden, while the page waits
 * for the first history answers, then removed. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;

  /**
   * Load the made-up run and draw its chart as the page draws one (ChartCard, buildSeries, the
   * board's theme and chart width), in a card outside the viewport that no reader or test sees;
   * then dispose of it. Returns what was drawn ({series: count, ms}), for tests.
   */
  function rehearseChart(board) {
    const t0 = performance.now();
    const run = new L.RunData(L.REHEARSAL_RUN);
    run.loadHistory(L.rehearsalHistory(Math.round(board.chartWidth())), null);
    const panel = L.panelsFor(run.fields()).find((p) => p.id === L.REHEARSAL_PANEL);
    const host = document.createElement("div");
    host.className = "rehearsal";
    host.setAttribute("aria-hidden", "true");
    // Laid out at a card's size (ECharts needs one) but off screen, hidden and out of the document's flow.
    host.style.cssText = `position: fixed; left: -10000px; top: 0; width: ${board.chartWidth() + 16}px; visibility: hidden; pointer-events: none; contain: strict; height: 320px;`;
    const card = new A.ChartCard(panel, {
      view: () => ({ scale: "auto", ignoreOutliers: true, expanded: false }),
      onChange() {},
      onExport() {},
      tooltip: () => "",
      onZoom() {},
      onResetZoom() {},
    });
    host.appendChild(card.card);
    document.body.appendChild(host);
    let series = 0;
    try {
      card.init(board.theme, board.dark);
      const entries = [{ run, color: "#1f77b4" }];
      const built = L.buildSeries(panel, entries, { xMode: "step", smoothing: 0, scale: "auto", ignoreOutliers: true, maxPoints: Math.round(board.chartWidth() / 2), window: null });
      card.render(built, L.xExtent([run], "step"), "step");
      card.setLegend([{ name: run.name, color: "#1f77b4" }], false);
      series = built.series.length;
    } finally {
      card.dispose();
      host.remove();
    }
    return { series, ms: performance.now() - t0 };
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.rehearseChart = rehearseChart;
})(self);
