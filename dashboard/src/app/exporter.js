/* Export what a chart shows: CSV / JSON of every step in the zoomed x range (from memory when the
 * page holds the run at full resolution, else fetched from the server at full resolution), or a PNG
 * of the chart. Browser only; the file formats are in lib/export.js. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;

  /** Save text (or a data: URL) as a download. */
  function download(name, content, type) {
    const a = document.createElement("a");
    const isUrl = typeof content === "string" && content.startsWith("data:");
    const url = isUrl ? content : URL.createObjectURL(new Blob([content], { type }));
    a.href = url;
    a.download = name;
    a.hidden = true;
    document.body.appendChild(a);
    a.click();
    a.remove();
    if (!isUrl) setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  /** Points of a response group's field, decoded: {steps, values} (empty when absent). */
  function group(resp, field) {
    const g = field.startsWith("eval/") ? resp.eval : field.startsWith("system/") ? resp.system : resp.series;
    const name = field.replace(/^(eval|system)\//, "");
    const s = g && g[name];
    return s ? { steps: s.step || [], values: L.decodeArray(s.value) } : { steps: [], values: [] };
  }

  class Exporter {
    /** app: {board, entries(), feed, settings() -> {xMode, smoothing}, notice(text, isError)}. */
    constructor(app) {
      this.app = app;
      this.last = null; // {name, text} of the last CSV/JSON export (for tests and the curious)
    }

    /** Export chart `panelId` as "csv", "json" or "png"; resolves to {name, text | dataUrl}. */
    async exportChart(panelId, format) {
      const card = format === "png" ? this.app.board.ensureDrawn(panelId) : this.app.board.panels.get(panelId);
      if (!card) throw new Error("no chart " + panelId);
      const zoom = this.app.board.zoom;
      const span = zoom ? [zoom.startValue, zoom.endValue].map((v) => Math.round(v)) : ["all"];
      if (format === "png") {
        const name = L.fileName(["gradmon", panelId].concat(span), "png");
        const dataUrl = card.png(A.themeColors().card);
        download(name, dataUrl);
        return { name, dataUrl };
      }
      const parts = await this.parts(card.panel, zoom);
      const settings = this.app.settings();
      const name = L.fileName(["gradmon", panelId].concat(span), format);
      const text = format === "csv"
        ? L.toCSV(parts)
        : L.toJSON(parts, {
            chart: panelId, title: card.panel.title, x_axis: settings.xMode, x_range: zoom ? [zoom.startValue, zoom.endValue] : null,
            smoothing: settings.smoothing, exported_at: Date.now() / 1000,
          });
      download(name, text, format === "csv" ? "text/csv" : "application/json");
      if (parts.some((p) => !p.exact)) {
        this.app.notice("The range is longer than the server returns at full resolution: " + name + " holds downsampled points.", false);
      }
      this.last = { name, text };
      return this.last;
    }

    /** The export parts of a panel: per shown run and field, every step of the zoomed range. */
    async parts(panel, zoom) {
      const settings = this.app.settings();
      const out = [];
      for (const { run } of this.app.entries()) {
        const fields = panel.fields.filter((f) => run.pointCount(f) > 0);
        if (!fields.length) continue;
        const range = zoom ? this.app.feed._stepRange(run, zoom) : [run.firstStep, run.lastStep];
        if (!range) continue;
        const [a, b] = range;
        let resp = null;
        if (!run.exact && this.app.feed.client) resp = await this.app.feed.fetchRange(run.name, a, b);
        for (const field of fields) {
          let pts;
          let ts;
          let exact = true;
          if (resp) {
            pts = group(resp, field);
            const t = group(resp, "ts");
            const at = new Map(t.steps.map((s, i) => [s, t.values[i]]));
            ts = pts.steps.map((s) => (at.has(s) ? at.get(s) : run.tsAt(s)));
            exact = resp.exact !== false;
          } else {
            const s = run.series.get(field);
            const sl = L.sliceRange(s.steps, s.values, a, b);
            pts = { steps: sl.steps, values: sl.values };
            ts = pts.steps.map((st) => run.tsAt(st));
            exact = run.exact || field.startsWith("eval/") || field.startsWith("system/");
          }
          out.push({
            run: run.name, field, exact, step: pts.steps,
            wall_time: ts.some(Number.isFinite) ? ts : null,
            value: pts.values,
            smoothed: this._smoothed(run, field, settings.smoothing, pts.steps),
          });
        }
      }
      return out;
    }

    /** The smoothed values at `steps` when the page has them exactly (never approximations). */
    _smoothed(run, field, alpha, steps) {
      if (!(alpha > 0) || !L.smoothable(field)) return null;
      const sm = run.smoothed(field, alpha);
      if (sm.quality === "approx") return null;
      const at = new Map(sm.steps.map((s, i) => [s, sm.values[i]]));
      return steps.map((s) => (at.has(s) ? at.get(s) : null));
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  Object.assign(root.GradmonApp, { Exporter, download });
})(self);
