/* The chart board: sections of chart cards, linked zoom (app/zoom.js), paced redraws (app/redraw.js),
 * theme. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  const DARK = "(prefers-color-scheme: dark)";
  const NEAR_PX = 300; // a chart this close to the viewport is drawn

  class ChartBoard {
    /**
     * container: the element holding the sections. app: {entries() -> [{run, color}], settings()
     * -> {xMode, smoothing}, panelView(id) -> {scale, ignoreOutliers, expanded, hidden}, tooltip,
     * afterDraw(live), holdMs(), onZoomEnd(zoom | null), onPanelChange(id, what, value), onExport(id, format)}.
     */
    constructor(container, app) {
      this.container = container;
      this.app = app;
      this.panels = new Map(); // id -> ChartCard (drawn charts only; hidden ones have none)
      this.sections = new Map(); // id -> {el, grid, head, hiddenBox}
      this.redraw = new A.RedrawLoop({
        holdMs: () => (this.app.holdMs ? this.app.holdMs() : 0),
        begin: () => this._beginPass(),
        inputs: () => this._inputs(this.app.entries()),
        wanted: (card) => this.panels.get(card.panel.id) === card && card.visible,
        drawCard: (card, inputs) => this._drawCard(card, inputs),
        ended: (live) => this.app.afterDraw && this.app.afterDraw(live),
      });
      this.extent = null;
      this.linked = new A.LinkedZoom(this, (zoom) => {
        this.markDirty(); // redraw the curves at full resolution for the new window
        this.app.onZoomEnd(zoom);
      });
      this.media = root.matchMedia ? root.matchMedia(DARK) : null;
      this.dark = !!(this.media && this.media.matches);
      this.theme = A.themeColors();
      if (this.media) this.media.addEventListener("change", () => this.setTheme());
      // Charts are created and redrawn only near the viewport: a long dashboard costs what is seen.
      this.visibility = new IntersectionObserver((list) => this._onVisibility(list), { rootMargin: NEAR_PX + "px 0px" });
      this.resizeObserver = new ResizeObserver((list) => {
        for (const e of list) {
          const card = this.panels.get(e.target.parentElement && e.target.parentElement.dataset.panel);
          if (!card) continue;
          card.width = e.target.clientWidth; // read here, where layout is done (no forced layout in a draw)
          if (card.chart) card.chart.resize();
        }
      });
    }

    /** Whether a redraw is asked for and not yet begun. */
    get dirty() {
      return this.redraw.dirty;
    }

    /** Truthy while a redraw is scheduled or under way (`!dirty && !frame`: everything asked for is drawn). */
    get frame() {
      return this.redraw.busy;
    }

    /** Redraws begun so far. */
    get renderCount() {
      return this.redraw.passes;
    }

    /**
     * Ask for a redraw; coalesced and paced (app/redraw.js, lib/pacer.js). `live`: only streamed
     * records changed the data, a redraw that may wait longer than one the reader asked for.
     */
    markDirty(live) {
      this.redraw.request(live);
    }

    /** Chart width in px (for history resolution: about two points per pixel). */
    chartWidth() {
      for (const c of this.panels.values()) if (c.chart && c.width) return c.width;
      // No chart yet: the width a card will get in the grid (minmax(min(100%, 440px), 1fr), 12px gaps).
      const w = this.container.clientWidth || 900;
      const cols = Math.max(1, Math.floor((w + 12) / 452));
      return Math.max(240, Math.floor((w - 12 * (cols - 1)) / cols) - 16);
    }

    /**
     * A redraw pass begins: lay out the sections and cards; the charts near the viewport whose data
     * or view changed are to be drawn, those in the viewport first.
     */
    _beginPass() {
      const entries = this.app.entries();
      const fields = new Set();
      for (const e of entries) for (const f of e.run.fields()) fields.add(f);
      this._sync(L.sectionsFor(L.panelsFor(Array.from(fields))));
      const inputs = this._inputs(entries);
      const stale = [];
      for (const card of this.panels.values()) {
        card.sync(this.app.panelView(card.panel.id));
        if (!card.visible) continue; // drawn when it comes near the viewport (_onVisibility)
        if (card.chart && card.key === this._key(card, inputs)) continue;
        const r = card.card.getBoundingClientRect();
        stale.push({ card, top: r.top, bottom: r.bottom });
      }
      return { queue: L.passOrder(stale, window.innerHeight).map((it) => it.card), inputs };
    }

    /** What every chart of a redraw is drawn from: the runs, view settings, x extent, window, resolution. */
    _inputs(entries) {
      const settings = this.app.settings();
      const extent = this._extent(entries, settings.xMode);
      this.extent = extent;
      return {
        entries,
        settings,
        extent,
        win: this.linked.win,
        // About two points per pixel for one run; one per run when several share the chart (the
        // min/max decimation keeps every spike and non-finite point either way).
        maxPoints: Math.round((entries.length > 1 ? 1 : 2) * this.chartWidth()),
        versions: entries.map((e) => e.run.name + ":" + e.run.version + ":" + e.color).join(","),
      };
    }

    /** A card's drawing is current while this key is unchanged. */
    _key(card, inputs) {
      const pv = this.app.panelView(card.panel.id);
      const { settings, extent, win } = inputs;
      return [inputs.versions, settings.xMode, settings.smoothing, pv.scale, pv.ignoreOutliers, extent.min, extent.max,
        win ? win.startValue + ":" + win.endValue : "", inputs.maxPoints, this.dark].join("|");
    }

    _drawCard(card, inputs) {
      if (!card.chart) this._initChart(card);
      const key = this._key(card, inputs);
      if (card.key === key) return;
      card.key = key;
      const { entries, settings, extent, win } = inputs;
      const pv = this.app.panelView(card.panel.id);
      const built = L.buildSeries(card.panel, entries, {
        xMode: settings.xMode, smoothing: settings.smoothing, scale: pv.scale, ignoreOutliers: pv.ignoreOutliers, maxPoints: inputs.maxPoints, window: win,
      });
      card.render(built, extent, settings.xMode);
      const drawn = entries.filter((e) => card.panel.fields.some((f) => e.run.pointCount(f) > 0));
      card.setLegend(drawn.map((e) => ({ name: e.run.name, color: e.color })), card.panel.fields.some((f) => f.startsWith("eval/") && drawn.some((e) => e.run.pointCount(f) > 0)));
      // The zoom window is kept in x units: dispatched again when the chart is new or its x extent moved.
      const extentKey = extent.min + ":" + extent.max;
      if (win && (card.fresh || card.extentKey !== extentKey)) this.linked.show(card, win);
      card.extentKey = extentKey;
      card.fresh = false;
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

    /** Sections and cards as the fields and the view say: hidden charts get no instance. */
    _sync(sections) {
      const wantedSections = new Set(sections.map((s) => s.id));
      for (const [id, s] of this.sections) {
        if (wantedSections.has(id)) continue;
        s.el.remove();
        this.sections.delete(id);
      }
      const shown = new Set();
      let prevSection = null;
      for (const sec of sections) {
        const s = this._section(sec);
        const want = prevSection ? prevSection.el.nextSibling : this.container.firstChild;
        if (want !== s.el) this.container.insertBefore(s.el, want);
        prevSection = s;
        const hidden = [];
        let prev = null;
        for (const panel of sec.panels) {
          if (this.app.panelView(panel.id).hidden) {
            hidden.push(panel);
            continue;
          }
          shown.add(panel.id);
          let card = this.panels.get(panel.id);
          if (!card) card = this._createCard(panel, s.grid);
          card.panel = panel;
          const at = prev ? prev.card.nextSibling : s.grid.firstChild;
          if (at !== card.card) s.grid.insertBefore(card.card, at);
          prev = card;
        }
        this._hiddenList(s, hidden, sec.panels.length);
      }
      for (const [id, card] of this.panels) {
        if (shown.has(id)) continue;
        this.resizeObserver.unobserve(card.el);
        this.visibility.unobserve(card.card);
        card.dispose();
        this.panels.delete(id);
      }
      // New cards near the viewport are drawn in this draw (the observer reports a frame later).
      const near = window.innerHeight + NEAR_PX;
      for (const card of this.panels.values()) {
        if (card.visible !== null) continue;
        const r = card.card.getBoundingClientRect();
        card.visible = r.top < near && r.bottom > -NEAR_PX;
      }
    }

    _onVisibility(list) {
      let more = false;
      for (const e of list) {
        const card = this.panels.get(e.target.dataset.panel);
        if (!card) continue;
        if (e.isIntersecting && !card.visible) more = true;
        card.visible = e.isIntersecting;
      }
      if (more) this.markDirty();
    }

    _initChart(card) {
      card.init(this.theme, this.dark);
      card.width = card.el.clientWidth;
      card.fresh = true;
      card.key = null;
      this.resizeObserver.observe(card.el);
    }

    /** Draw one chart now, wherever it is (an export of a chart never scrolled to). */
    ensureDrawn(id) {
      const card = this.panels.get(id);
      if (!card) return null;
      card.visible = true;
      this._drawCard(card, this._inputs(this.app.entries()));
      return card;
    }

    _section(sec) {
      let s = this.sections.get(sec.id);
      if (s) {
        s.title.textContent = sec.title;
        return s;
      }
      const el = A.el("section", "chart-section");
      el.dataset.section = sec.id;
      const head = A.el("div", "section-head");
      const title = A.el("h2", "section-title", sec.title);
      const hiddenBox = A.el("span", "hidden-charts");
      head.append(title, hiddenBox);
      const grid = A.el("div", "charts");
      el.append(head, grid);
      s = { el, head, title, grid, hiddenBox };
      this.sections.set(sec.id, s);
      return s;
    }

    /** "hidden: [zscore] [clip_coef]" in the section's head: a click shows the chart again. */
    _hiddenList(s, hidden, total) {
      const key = hidden.map((p) => p.id).join("|");
      if (s.hiddenBox.dataset.key === key) return;
      s.hiddenBox.dataset.key = key;
      s.hiddenBox.textContent = "";
      s.el.classList.toggle("all-hidden", hidden.length === total);
      if (!hidden.length) return;
      s.hiddenBox.appendChild(document.createTextNode("hidden:"));
      for (const p of hidden) {
        const b = A.el("button", "show-chart", p.title);
        b.type = "button";
        b.dataset.panel = p.id;
        b.title = "Show this chart again";
        b.addEventListener("click", () => this.app.onPanelChange(p.id, "hidden", false));
        s.hiddenBox.appendChild(b);
      }
    }

    _createCard(panel, grid) {
      const card = new A.ChartCard(panel, {
        view: (id) => this.app.panelView(id),
        onChange: (id, what, value) => this.app.onPanelChange(id, what, value),
        onExport: (id, format) => this.app.onExport(id, format),
        tooltip: (params, id) => this.app.tooltip(params, id),
        onZoom: (c, ev) => this.linked.onChartZoom(c, ev),
        onResetZoom: () => this.resetZoom(),
      });
      grid.appendChild(card.card);
      card.visible = null; // not known until laid out (see _sync)
      this.panels.set(panel.id, card);
      this.visibility.observe(card.card);
      return card;
    }

    /** The settled zoom window {startValue, endValue} in x units; null = everything. */
    get zoom() {
      return this.linked.zoom;
    }

    /** Zoom every chart to [a, b] in x units. */
    zoomTo(a, b) {
      this.linked.zoomTo(a, b);
    }

    resetZoom() {
      this.linked.reset();
    }

    /** Re-create the charts in the current theme (the system switched between light and dark). */
    setTheme() {
      this.dark = !!(this.media && this.media.matches);
      this.theme = A.themeColors();
      for (const c of this.panels.values()) {
        if (!c.chart) continue;
        c.chart.dispose();
        c.chart = null;
        this._initChart(c);
      }
      this.markDirty();
    }

    /** Rendered marker points of a chart: [{role, run, step, x, y, label}] (for tests and the curious). */
    markers(panelId) {
      const out = [];
      const card = this.panels.get(panelId);
      if (!card) return out;
      for (const s of card.series) {
        if (!s.gradmonRole) continue;
        for (const d of s.data) {
          const label = d.nonfinite || (d.clipped ? "clipped" : s.gradmonRole);
          out.push({ role: s.gradmonRole, run: s.id.split("|")[0], step: d.value[2], x: d.value[0], y: d.value[1], label, value: d.trueValue !== undefined ? d.trueValue : d.clipped ? d.clipped.value : d.value[1] });
        }
      }
      return out;
    }

    /** Current x-axis zoom window of the first chart: {start, end} in percent, {startValue, endValue} in x units. */
    currentZoom() {
      return this.linked.current();
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.ChartBoard = ChartBoard;
})(self);
