/* window.gradmon: the page's state and a few actions, for tests and for the curious (read-only use).
 * Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;

  /** ctx: {state, board(), banner(), alarmDetail(), exporter(), entries(), loadedRuns(), selectRun(name, on), replayText(name, text)}. */
  function pageHandle(ctx) {
    const { state } = ctx;
    const run = (name) => state.runs.get(name);
    return {
      state,
      get board() {
        return ctx.board();
      },
      runs: () => Array.from(state.runsInfo.keys()),
      selected: () => state.selected.slice(),
      select: (name, on) => ctx.selectRun(name, on !== false),
      loaded: () => ctx.loadedRuns(),
      layers(name) {
        const r = run(name);
        return r && r.layers ? { step: r.layers.step, rows: L.layerRows(r.layers, 0) } : null;
      },
      systemPoints(name, field) {
        const r = run(name);
        const s = r && r.series.get("system/" + field);
        return s ? { steps: s.steps.slice(), values: s.values.slice() } : { steps: [], values: [] };
      },
      pointCount: (name, field) => (run(name) ? run(name).pointCount(field) : 0),
      lastStep: (name) => (run(name) ? run(name).lastStep : null),
      panels: () => (ctx.board() ? Array.from(ctx.board().panels.keys()) : []),
      sections: () => (ctx.board() ? Array.from(ctx.board().grid.sections.keys()) : []),
      markers: (panel) => (ctx.board() ? ctx.board().markers(panel) : []),
      /** Distinct steps carrying a mark of `kind` ("spike", "skip", "nonfinite"). */
      marks: (name, kind) => (run(name) ? Array.from(new Set(run(name).marksOf(kind).map((m) => m.step))) : []),
      spikes: () => ctx.entries().flatMap(({ run: r }) => r.marksOf("spike").map((m) => ({ run: r.name, step: m.step, value: m.value }))),
      incidents: () => (ctx.banner() ? ctx.banner().incidents().map((i) => ({ run: i.run, reason: i.reason, start: i.start, end: i.end, flagged: i.flagged, ongoing: i.ongoing })) : []),
      notifications: () => (ctx.banner() ? ctx.banner().sent.slice() : []),
      /** The alarm shown in the detail view: {run, step, reason, view (lib/forensics.js)}, or null. */
      alarmDetail: () => (ctx.alarmDetail() && ctx.alarmDetail().shown ? JSON.parse(JSON.stringify(ctx.alarmDetail().shown)) : null),
      /** The smoothed points drawn on a chart for a run's field: [[step, value]]. */
      smoothedDrawn(panel, name, field) {
        const card = ctx.board() && ctx.board().panels.get(panel);
        const s = card && card.series.find((x) => x.id === name + "|" + field + "|smooth");
        return s ? s.data.map((d) => [d[2], d[1]]) : [];
      },
      renderCount: () => (ctx.board() ? ctx.board().renderCount : 0),
      /** How many runs a chart's last draw showed (0: not drawn). */
      drawnRuns(panel) {
        const card = ctx.board() && ctx.board().panels.get(panel);
        return card && card.chart && card.drawnRuns ? card.drawnRuns : 0;
      },
      zoom: () => (ctx.board() ? ctx.board().currentZoom() : null),
      view: () => JSON.parse(JSON.stringify(state.view)),
      exportChart: (panel, format) => ctx.exporter().exportChart(panel, format),
      replayText: (name, text) => ctx.replayText(name, text),
      setXMode(mode) {
        const sel = document.querySelector("#xmode");
        sel.value = mode;
        sel.dispatchEvent(new Event("change"));
      },
    };
  }

  root.GradmonApp = root.GradmonApp || {};
  A.pageHandle = pageHandle;
})(self);
