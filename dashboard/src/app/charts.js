/* The chart grid: one ECharts instance per panel, linked zoom, throttled redraws. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const MIN_FRAME_MS = 100; // at most 10 redraws per second while streaming

  function durationLabel(s) {
    if (!Number.isFinite(s)) return "";
    const a = Math.abs(s);
    if (a < 10) return Number(s.toFixed(2)) + "s";
    if (a < 120) return Math.round(s) + "s";
    if (a < 7200) return (s / 60).toFixed(a < 600 ? 1 : 0) + "m";
    return (s / 3600).toFixed(1) + "h";
  }

  class ChartBoard {
    /**
     * container: the element holding the chart cards. app: {entries() -> [{run, color}], settings,
     * onZoomEnd(range|null), onLogToggle()}.
     */
    constructor(container, app) {
      this.container = container;
      this.app = app;
      this.panels = new Map(); // id -> {panel, el, chart, key, markerPoints}
      this.dirty = false;
      this.frame = 0;
      this.lastDraw = 0;
      this.renderCount = 0;
      this.zoomTimer = null;
      this.zoom = null; // {startValue, endValue} in x units, null = whole range
      this.pct = [0, 100]; // the shared zoom window in percent of the common x extent
      this.extent = null;
      this.syncing = false;
      this.resizeObserver = new ResizeObserver(() => {
        for (const p of this.panels.values()) p.chart.resize();
      });
    }

    /** Ask for a redraw; coalesced to one per animation frame and at most every MIN_FRAME_MS. */
    markDirty() {
      this.dirty = true;
      if (this.frame) return;
      const wait = Math.max(0, MIN_FRAME_MS - (performance.now() - this.lastDraw));
      this.frame = setTimeout(() => {
        requestAnimationFrame(() => {
          this.frame = 0;
          if (this.dirty) this.draw();
        });
      }, wait);
    }

    /** Chart width in px (for history resolution: about two points per pixel). */
    chartWidth() {
      const first = this.panels.values().next().value;
      if (first && first.el.clientWidth) return first.el.clientWidth;
      // No chart yet: the width a card will get in the grid (minmax(440px, 1fr), 12px gaps).
      const w = this.container.clientWidth || 900;
      const cols = Math.max(1, Math.floor((w + 12) / 452));
      return Math.max(300, Math.floor((w - 12 * (cols - 1)) / cols) - 16);
    }

    draw() {
      this.dirty = false;
      this.lastDraw = performance.now();
      this.renderCount++;
      const entries = this.app.entries();
      const settings = this.app.settings;
      const fields = new Set();
      for (const e of entries) for (const f of e.run.fields()) fields.add(f);
      const panels = L.panelsFor(Array.from(fields));
      this._syncPanels(panels);
      const extent = this._extent(entries, settings.xMode);
      this.extent = extent;
      const zoomed = this.pct[0] > 0.01 || this.pct[1] < 99.99;
      const win = zoomed ? this._values(this.pct) : null; // from the current extent: right while streaming
      const drawSettings = Object.assign({}, settings, { maxPoints: Math.round(2 * this.chartWidth()), window: win });
      const versions = entries.map((e) => e.run.name + ":" + e.run.version + ":" + e.color).join(",");
      for (const panel of panels) {
        const p = this.panels.get(panel.id);
        const log = !!(panel.logToggle && settings.log);
        const key = [versions, settings.xMode, settings.smoothing, log, extent.min, extent.max,
          win ? win.startValue + ":" + win.endValue : "", drawSettings.maxPoints].join("|");
        if (p.key === key) continue;
        p.key = key;
        const built = L.buildSeries(panel, entries, drawSettings);
        p.markerPoints = built.markerPoints;
        p.series = built.series;
        const time = settings.xMode === "wall";
        p.chart.setOption(
          {
            xAxis: {
              type: time ? "time" : "value",
              min: extent.min,
              max: extent.max,
              axisLabel: settings.xMode === "relative" ? { formatter: durationLabel } : { formatter: null, hideOverlap: true },
              name: settings.xMode === "step" ? "step" : "",
            },
            yAxis: {
              type: log ? "log" : "value",
              scale: !log,
              axisLabel: { formatter: panel.unit === "bytes" ? (v) => L.formatBytes(v) : (v) => L.formatValue(v) },
            },
            series: built.series,
          },
          { replaceMerge: ["series"], lazyUpdate: false },
        );
      }
      this.app.afterDraw && this.app.afterDraw();
    }

    _extent(entries, mode) {
      let min = Infinity;
      let max = -Infinity;
      for (const { run } of entries) {
        const a = run.firstStep;
        const b = run.lastStep;
        if (a === null) continue;
        const xa = L.xOf(run, a, mode);
        const xb = L.xOf(run, b, mode);
        if (Number.isFinite(xa)) min = Math.min(min, xa);
        if (Number.isFinite(xb)) max = Math.max(max, xb);
      }
      if (!Number.isFinite(min)) return { min: null, max: null };
      if (max <= min) max = min + 1;
      return { min, max };
    }

    _syncPanels(panels) {
      const wanted = new Set(panels.map((p) => p.id));
      for (const [id, p] of this.panels) {
        if (wanted.has(id)) continue;
        this.resizeObserver.unobserve(p.el);
        p.chart.dispose();
        p.card.remove();
        this.panels.delete(id);
      }
      let prev = null;
      for (const panel of panels) {
        let p = this.panels.get(panel.id);
        if (!p) {
          p = this._createPanel(panel);
          this.panels.set(panel.id, p);
        }
        p.panel = panel;
        // keep DOM order equal to panel order
        const want = prev ? prev.card.nextSibling : this.container.firstChild;
        if (want !== p.card) this.container.insertBefore(p.card, want);
        prev = p;
      }
    }

    _createPanel(panel) {
      const card = document.createElement("section");
      card.className = "chart-card";
      card.dataset.panel = panel.id;
      const head = document.createElement("div");
      head.className = "chart-head";
      const title = document.createElement("h2");
      title.textContent = panel.title;
      head.appendChild(title);
      if (panel.logToggle) {
        const lab = document.createElement("label");
        lab.className = "toggle";
        const box = document.createElement("input");
        box.type = "checkbox";
        box.className = "log-toggle";
        box.checked = !!this.app.settings.log;
        box.addEventListener("change", () => this.app.onLogToggle(box.checked));
        lab.append(box, document.createTextNode(" log scale"));
        head.appendChild(lab);
      }
      const el = document.createElement("div");
      el.className = "chart";
      card.append(head, el);
      this.container.appendChild(card);
      const chart = echarts.init(el, null, { renderer: "canvas" });
      chart.setOption(this._baseOption());
      if (this.pct[0] > 0 || this.pct[1] < 100) chart.dispatchAction({ type: "dataZoom", start: this.pct[0], end: this.pct[1] });
      chart.on("datazoom", (ev) => this._onZoom(chart, ev));
      this.resizeObserver.observe(el);
      return { panel, card, el, chart, key: null, markerPoints: 0, series: [] };
    }

    _baseOption() {
      return {
        animation: false,
        grid: { left: 60, right: 18, top: 16, bottom: 58 },
        tooltip: {
          trigger: "axis",
          confine: true,
          axisPointer: { type: "line", animation: false },
          formatter: (params) => this.app.tooltip(params),
          transitionDuration: 0,
        },
        xAxis: { type: "value", name: "step", nameLocation: "end", nameGap: 4, nameTextStyle: { color: "#888", verticalAlign: "top", padding: [8, 0, 0, 0] } },
        yAxis: { type: "value", scale: true, splitLine: { lineStyle: { color: "#eee" } }, axisLabel: { formatter: (v) => L.formatValue(v) } },
        dataZoom: [
          { type: "inside", xAxisIndex: 0, filterMode: "filter", zoomOnMouseWheel: true, moveOnMouseMove: true },
          { type: "slider", xAxisIndex: 0, filterMode: "filter", height: 14, bottom: 8, showDetail: false, brushSelect: false },
        ],
        series: [],
      };
    }

    /**
     * Linked zoom: every chart has the same x extent (set in draw), so one percent window fits all.
     * Done by hand rather than echarts.connect, which would also pop up every chart's tooltip at once.
     */
    _onZoom(chart, ev) {
      if (this.syncing) return;
      const p = ev && ev.batch ? ev.batch[0] : ev || {};
      let start = p.start;
      let end = p.end;
      if ((start === undefined || end === undefined) && p.startValue !== undefined && this.extent && this.extent.min !== null) {
        const span = this.extent.max - this.extent.min;
        start = ((p.startValue - this.extent.min) / span) * 100;
        end = ((p.endValue - this.extent.min) / span) * 100;
      }
      if (start === undefined || end === undefined) return;
      this._setWindow(start, end, chart);
    }

    _setWindow(start, end, source) {
      this.pct = [start, end];
      this.syncing = true;
      try {
        for (const q of this.panels.values()) {
          if (q.chart !== source) q.chart.dispatchAction({ type: "dataZoom", start, end });
        }
      } finally {
        this.syncing = false;
      }
      clearTimeout(this.zoomTimer);
      // Refetch only when the user stops zooming: one request per gesture, not per wheel tick.
      this.zoomTimer = setTimeout(() => {
        const full = this.pct[0] <= 0.01 && this.pct[1] >= 99.99;
        this.zoom = full ? null : this._values(this.pct);
        this.markDirty(); // redraw the curves at full resolution for the new window
        this.app.onZoomEnd(this.zoom);
      }, 350);
    }

    _values(pct) {
      if (!this.extent || this.extent.min === null) return null;
      const span = this.extent.max - this.extent.min;
      return { startValue: this.extent.min + (pct[0] / 100) * span, endValue: this.extent.min + (pct[1] / 100) * span };
    }

    /** Zoom every chart to [a, b] in x units. */
    zoomTo(a, b) {
      if (!this.extent || this.extent.min === null) return;
      const span = this.extent.max - this.extent.min;
      const start = Math.max(0, ((a - this.extent.min) / span) * 100);
      const end = Math.min(100, ((b - this.extent.min) / span) * 100);
      this._setWindow(start, end, null);
      this.zoom = { startValue: a, endValue: b };
    }

    resetZoom() {
      this._setWindow(0, 100, null);
      this.zoom = null;
    }

    /** Rendered marker points of a panel: [{role, run, step, label}] (for tests and the status line). */
    markers(panelId) {
      const out = [];
      const p = this.panels.get(panelId);
      if (!p) return out;
      for (const s of p.series) {
        if (!s.gradmonRole) continue;
        for (const d of s.data) out.push({ role: s.gradmonRole, run: s.id.split("|")[0], step: d.value[2], x: d.value[0], y: d.value[1], label: d.nonfinite || "spike" });
      }
      return out;
    }

    /** Current x-axis zoom window of the first chart, in x units: {startValue, endValue} or null. */
    currentZoom() {
      const first = this.panels.values().next().value;
      if (!first) return null;
      const dz = first.chart.getOption().dataZoom[0];
      return { start: dz.start, end: dz.end, startValue: dz.startValue, endValue: dz.endValue };
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.ChartBoard = ChartBoard;
  root.GradmonApp.durationLabel = durationLabel;
})(self);
