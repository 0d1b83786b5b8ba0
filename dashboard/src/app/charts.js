/* The chart board: what is drawn and when — paced redraws (app/redraw.js) of the cards that
 * app/grid.js lays out, linked zoom (app/zoom.js), theme. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  const DARK = "(prefers-color-scheme: dark)";

  class ChartBoard {
    /**
     * container: the element holding the sections. app: {entries() -> [{run, color}], settings()
     * -> {xMode, smoothing}, panelView(id) -> {scale, ignoreOutliers, expanded, hidden}, tooltip,
     * afterDraw(live), holdMs(), onZoomEnd(zoom | null), onPanelChange(id, what, value), onExport(id, format)}.
     */
    constructor(container, app) {
      this.container = container;
      this.app = app;
      this.grid = new A.CardGrid(container, {
        panelView: (id) => this.app.panelView(id),
        createCard: (panel) => this._createCard(panel),
        showChart: (id) => this.app.onPanelChange(id, "hidden", false),
        nearer: () => this.markDirty(),
      });
      this.redraw = new A.RedrawLoop({
        holdMs: () => (this.app.holdMs ? this.app.holdMs() : 0),
        begin: () => this._beginPass(),
        inputs: () => this._inputs(this.app.entries()),
        wanted: (card) => this.panels.get(card.panel.id) === card && card.visible,
        drawCard: (card, inputs, inView) => this._drawCard(card, inputs, inView),
        ended: (live) => {
          this._interactionSoon();
          if (this.app.afterDraw) this.app.afterDraw(live);
        },
      });
      this.uninteractive = new Set(); // cards drawn without their interaction, to get it soon
      this.interactionFrame = 0;
      this.extent = null;
      this.linked = new A.LinkedZoom(this, (zoom) => {
        this.markDirty(); // redraw the curves at full resolution for the new window
        this.app.onZoomEnd(zoom);
      });
      this.media = root.matchMedia ? root.matchMedia(DARK) : null;
      this.dark = !!(this.media && this.media.matches);
      this.theme = A.themeColors();
      if (this.media) this.media.addEventListener("change", () => this.setTheme());
    }

    /** id -> ChartCard of the shown charts (app/grid.js). */
    get panels() {
      return this.grid.panels;
    }

    /** Whether a redraw is asked for and not yet begun. */
    get dirty() {
      return this.redraw.dirty;
    }

    /** Truthy while a redraw is scheduled or under way (`!dirty && !frame`: everything asked for is drawn). */
    get frame() {
      return this.redraw.busy;
    }

    /** Truthy while charts drawn without their interaction (tooltip, zoom) wait for it (_interactionSoon). */
    get interacting() {
      return this.interactionFrame;
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
      return L.chartWidthIn(this.container.clientWidth); // no chart yet: the width a card will get
    }

    /**
     * A redraw pass begins: lay out the sections and cards; the charts near the viewport whose data
     * or view changed are to be drawn, those in the viewport first (`inView` of them: the first slice).
     */
    _beginPass() {
      const entries = this.app.entries();
      const fields = new Set();
      for (const e of entries) for (const f of e.run.fields()) fields.add(f);
      this.grid.sync(L.sectionsFor(L.panelsFor(Array.from(fields))));
      const inputs = this._inputs(entries);
      const stale = [];
      for (const card of this.panels.values()) {
        card.sync(this.app.panelView(card.panel.id));
        if (!card.visible) continue; // drawn when it comes near the viewport (app/grid.js)
        if (card.chart && card.key === this._key(card, inputs)) continue;
        const r = card.card.getBoundingClientRect();
        if (!card.chart) this._measure(card); // (the layout just made: no layout per chart created)
        stale.push({ card, top: r.top, bottom: r.bottom });
      }
      const inView = stale.filter((it) => L.inViewport(it, window.innerHeight)).length;
      return { queue: L.passOrder(stale, window.innerHeight).map((it) => it.card), inView, inputs };
    }

    /** What every chart of a redraw is drawn from: the runs, view settings, x extent, window, resolution. */
    _inputs(entries) {
      const settings = this.app.settings();
      const extent = L.xExtent(entries.map((e) => e.run), settings.xMode);
      this.extent = extent;
      return {
        entries,
        settings,
        extent,
        win: this.linked.win,
        // Two points per pixel for one run, one each when several share the chart (lib/opening.js).
        maxPoints: Math.round(L.pointsPerPixel(entries.length) * this.chartWidth()),
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

    /**
     * Draw a card. `firstLook`: it is one of a pass's charts in the viewport; drawn for the first
     * time, with no zoom window, it is drawn without its interaction (tooltip, zoom), which it gets
     * in the animation frame after the pass (_interactionSoon): the viewport's charts are drawn
     * first, then the rest.
     */
    _drawCard(card, inputs, firstLook) {
      if (!card.chart) this._initChart(card);
      const key = this._key(card, inputs);
      if (card.key === key) return;
      card.key = key;
      const { entries, settings, extent, win } = inputs;
      const pv = this.app.panelView(card.panel.id);
      const built = L.buildSeries(card.panel, entries, {
        xMode: settings.xMode, smoothing: settings.smoothing, scale: pv.scale, ignoreOutliers: pv.ignoreOutliers, maxPoints: inputs.maxPoints, window: win,
      });
      card.render(built, extent, settings.xMode, !!firstLook && !win);
      if (!card.interactive) this.uninteractive.add(card);
      const drawn = entries.filter((e) => card.panel.fields.some((f) => e.run.pointCount(f) > 0));
      card.drawnRuns = drawn.length;
      card.setLegend(drawn.map((e) => ({ name: e.run.name, color: e.color })), card.panel.fields.some((f) => f.startsWith("eval/") && drawn.some((e) => e.run.pointCount(f) > 0)));
      // The zoom window is kept in x units: dispatched again when the chart is new or its x extent moved.
      const extentKey = extent.min + ":" + extent.max;
      if (win && (card.fresh || card.extentKey !== extentKey)) this.linked.show(card, win);
      card.extentKey = extentKey;
      card.fresh = false;
    }

    /**
     * From the next animation frame on (the first viewport painted), the interaction of the charts
     * drawn without it, in their drawing order, a few per frame (each is a redraw of its chart: all
     * in one task would hold the page for as long as the viewport's first draw).
     */
    _interactionSoon() {
      if (this.interactionFrame || !this.uninteractive.size) return;
      this.interactionFrame = requestAnimationFrame(() => {
        this.interactionFrame = 0;
        const t0 = performance.now();
        for (const card of this.uninteractive) {
          this._interact(card);
          if (performance.now() - t0 >= L.REDRAW.SLICE_MS) break;
        }
        this._interactionSoon();
      });
    }

    /** Put a card's interaction on now (and show the zoom window there, if any). */
    _interact(card) {
      this.uninteractive.delete(card);
      if (card.addInteraction() && this.linked.win) this.linked.show(card, this.linked.win);
    }

    _initChart(card) {
      const size = card.measured;
      card.measured = null;
      card.init(this.theme, this.dark, size);
      card.width = size ? size.width : card.el.clientWidth;
      card.fresh = true;
      card.key = null;
      this.grid.observeSize(card);
    }

    /** Note a card's chart element size for its chart's creation (_initChart); none while it has no size. */
    _measure(card) {
      const width = card.el.clientWidth;
      const height = card.el.clientHeight;
      card.measured = width > 0 && height > 0 ? { width, height } : null;
    }

    /** Draw one chart now, wherever it is (an export of a chart never scrolled to). */
    ensureDrawn(id) {
      const card = this.panels.get(id);
      if (!card) return null;
      card.visible = true;
      this._drawCard(card, this._inputs(this.app.entries()));
      return card;
    }

    _createCard(panel) {
      return new A.ChartCard(panel, {
        view: (id) => this.app.panelView(id),
        onChange: (id, what, value) => this.app.onPanelChange(id, what, value),
        onExport: (id, format) => this.app.onExport(id, format),
        tooltip: (params, id) => this.app.tooltip(params, id),
        onZoom: (c, ev) => this.linked.onChartZoom(c, ev),
        onResetZoom: () => this.resetZoom(),
        interact: (c) => this._interact(c),
      });
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
