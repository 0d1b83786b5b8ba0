/* One chart card: its DOM (title, badges, legend, tools), its ECharts instance and options. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /** Colours of the current theme, from the page's CSS variables (light or dark). */
  function themeColors() {
    const css = getComputedStyle(document.documentElement);
    const v = (name, fallback) => (css.getPropertyValue(name) || "").trim() || fallback;
    return { fg: v("--fg", "#1d2329"), muted: v("--muted", "#69737d"), line: v("--line", "#e3e6ea"), card: v("--card", "#fff"), grid: v("--grid", "#eee") };
  }

  function durationLabel(s) {
    if (!Number.isFinite(s)) return "";
    const a = Math.abs(s);
    if (a < 10) return Number(s.toFixed(2)) + "s";
    if (a < 120) return Math.round(s) + "s";
    if (a < 7200) return (s / 60).toFixed(a < 600 ? 1 : 0) + "m";
    return (s / 3600).toFixed(1) + "h";
  }

  /** An axis of the base option with a render's over it (labels merged too). */
  function axisOver(base, option) {
    return Object.assign({}, base, option, { axisLabel: Object.assign({}, base.axisLabel, option.axisLabel) });
  }

  class ChartCard {
    /**
     * panel: from panels.js; hooks: {view(id) -> {scale, ignoreOutliers, expanded}, onChange(id, what,
     * value), onExport(id, format), tooltip(params, id), onZoom(card, ev), onResetZoom(), interact(card)
     * (a pointer came over a chart: put its interaction on now)}.
     */
    constructor(panel, hooks) {
      this.panel = panel;
      this.hooks = hooks;
      this.key = null;
      this.series = [];
      this.built = null;
      this.card = el("section", "chart-card");
      this.card.dataset.panel = panel.id;
      const head = el("div", "chart-head");
      this.title = el("h3", "chart-title", panel.title);
      this.title.title = panel.fields.join(", ");
      this.badges = el("span", "badges");
      head.append(this.title, this.badges, this._tools());
      this.legend = el("div", "legend");
      this.el = el("div", "chart");
      this.card.append(head, this.legend, this.el);
      this.chart = null;
      this.width = 0; // of the chart element, px (kept by the board's ResizeObserver)
    }

    _tools() {
      const tools = el("div", "chart-tools");
      const v = this.hooks.view(this.panel.id);
      this.scaleSelect = el("select", "yscale");
      this.scaleSelect.title = "y scale: automatic (log when a series spans more than 3 decades), linear or log";
      for (const s of ["auto", "linear", "log"]) {
        const o = el("option", null, "y " + s);
        o.value = s;
        this.scaleSelect.appendChild(o);
      }
      this.scaleSelect.value = v.scale;
      this.scaleSelect.addEventListener("change", () => this.hooks.onChange(this.panel.id, "scale", this.scaleSelect.value));
      const lab = el("label", "toggle");
      lab.title = "Fit the y range to the bulk of the points; points beyond get a marker at the edge";
      this.outliersBox = el("input", "ignore-outliers");
      this.outliersBox.type = "checkbox";
      this.outliersBox.checked = v.ignoreOutliers;
      this.outliersBox.addEventListener("change", () => this.hooks.onChange(this.panel.id, "outliers", this.outliersBox.checked));
      lab.append(this.outliersBox, document.createTextNode(" ignore outliers"));
      this.expandButton = el("button", "tool expand", "⤢");
      this.expandButton.type = "button";
      this.expandButton.title = "Expand to full width and height (again to restore)";
      this.expandButton.addEventListener("click", () => this.hooks.onChange(this.panel.id, "expanded", !this.card.classList.contains("expanded")));
      const menu = el("details", "menu");
      const summary = el("summary", "tool", "⋯");
      summary.title = "Export or hide this chart";
      const pop = el("div", "menu-pop");
      const item = (act, text, fn) => {
        const b = el("button", null, text);
        b.type = "button";
        b.dataset.act = act;
        b.addEventListener("click", () => {
          menu.open = false;
          fn();
        });
        pop.appendChild(b);
      };
      item("csv", "Export CSV (full resolution)", () => this.hooks.onExport(this.panel.id, "csv"));
      item("json", "Export JSON (full resolution)", () => this.hooks.onExport(this.panel.id, "json"));
      item("png", "Export PNG", () => this.hooks.onExport(this.panel.id, "png"));
      item("hide", "Hide chart", () => this.hooks.onChange(this.panel.id, "hidden", true));
      menu.append(summary, pop);
      tools.append(this.scaleSelect, lab, this.expandButton, menu);
      return tools;
    }

    /**
     * Create the ECharts instance (once the card is in the document, so it has a size). `size`:
     * the chart element's {width, height} measured by the caller with others' (else ECharts reads
     * it, a layout of the page per chart when charts are created one after another).
     */
    init(theme, dark, size) {
      const opts = size ? { renderer: "canvas", width: size.width, height: size.height } : { renderer: "canvas" };
      this.chart = echarts.init(this.el, dark ? "dark" : null, opts);
      // Given to ECharts with the first render's series, in one setOption: one pass over the
      // option and one draw, not two.
      this.base = this._baseOption(theme);
      this.interaction = this._interactionOption(theme);
      this.drawn = false;
      this.interactive = false; // the tooltip and the zoom (slider, wheel) are on the chart
      this.chart.on("datazoom", (ev) => this.hooks.onZoom(this, ev));
      this.chart.getZr().on("dblclick", () => this.hooks.onResetZoom());
      // Drag a box to zoom: the toolbox's zoom select, always on (the toolbox itself is invisible),
      // switched on when a pointer first comes over the chart (it costs a redraw). Not on touch
      // screens, where a swipe over a chart must scroll the page (pinch and the slider zoom).
      const touch = root.matchMedia && root.matchMedia("(pointer: coarse)").matches;
      if (touch) return;
      // The toolbox is added then too: laying out its (invisible) icons was a quarter of a chart's
      // first draw, paid by every chart on the page whether a pointer ever came over it or not.
      const chart = this.chart;
      const arm = () => {
        this.el.removeEventListener("pointerenter", arm);
        if (this.chart !== chart) return;
        this.hooks.interact(this); // a pointer is here: its tooltip and zoom now, not after the others'
        chart.setOption({ toolbox: this._toolbox() });
        chart.dispatchAction({ type: "takeGlobalCursor", key: "dataZoomSelect", dataZoomSelectActive: true });
      };
      this.el.addEventListener("pointerenter", arm);
    }

    /** Put the tooltip and the zoom on a chart drawn without them; false when there was nothing to do. */
    addInteraction() {
      if (!this.chart || !this.drawn || this.interactive) return false;
      this.interactive = true;
      this.chart.setOption(this.interaction, { lazyUpdate: false });
      return true;
    }

    dispose() {
      if (this.chart) this.chart.dispose();
      this.chart = null;
      this.card.remove();
    }

    /** The toolbox's drag-a-box zoom, switched on by init()'s `arm` (the toolbox itself is invisible). */
    _toolbox() {
      return { show: true, itemSize: 0, showTitle: false, right: 0, top: 0, feature: { dataZoom: { yAxisIndex: "none", brushStyle: { color: "rgba(31,119,180,0.15)" } } } };
    }

    /** What every draw of the chart starts from: its look (the axes' styles, the grid). */
    _baseOption(theme) {
      return {
        backgroundColor: "transparent",
        animation: false,
        textStyle: { color: theme.fg },
        grid: { left: 56, right: 16, top: 14, bottom: 56 },
        xAxis: {
          type: "value", name: "step", nameLocation: "end", nameGap: 4,
          nameTextStyle: { color: theme.muted, verticalAlign: "top", padding: [8, 0, 0, 0] },
          axisLabel: { color: theme.muted }, axisLine: { lineStyle: { color: theme.muted } }, splitLine: { lineStyle: { color: theme.grid } },
        },
        yAxis: { type: "value", scale: true, splitLine: { lineStyle: { color: theme.grid } }, axisLabel: { color: theme.muted, formatter: (v) => L.formatValue(v) } },
        series: [],
      };
    }

    /**
     * The chart's interaction: the tooltip (and its axis pointer) and the zoom (wheel and slider).
     * A chart drawn for the first look at the page is drawn without it and gets it right after
     * (addInteraction): ECharts' code for these runs, and is compiled, off the path to the first
     * viewport drawn (a quarter of the first chart's draw).
     */
    _interactionOption(theme) {
      return {
        tooltip: {
          trigger: "axis",
          confine: true,
          axisPointer: { type: "line", animation: false },
          formatter: (params) => this.hooks.tooltip(params, this.panel.id),
          transitionDuration: 0,
          backgroundColor: theme.card,
          borderColor: theme.line,
          textStyle: { color: theme.fg },
          extraCssText: "max-width: 360px;",
        },
        dataZoom: [
          { type: "inside", xAxisIndex: 0, filterMode: "filter", zoomOnMouseWheel: "ctrl", moveOnMouseWheel: false, moveOnMouseMove: false },
          { type: "slider", xAxisIndex: 0, filterMode: "filter", height: 14, bottom: 8, showDetail: false, brushSelect: false, borderColor: theme.line, textStyle: { color: theme.muted } },
        ],
      };
    }

    /**
     * Draw the built series (chartopts.buildSeries) on the x extent; `mode` is the x-axis mode.
     * `firstLook`: a first draw may leave the interaction out (the board adds it right after).
     */
    render(built, extent, mode, firstLook) {
      this.built = built;
      this.series = built.series;
      const r = built.range;
      const bytes = this.panel.unit === "bytes";
      const option = {
        xAxis: {
          type: mode === "wall" ? "time" : "value",
          min: extent.min,
          max: extent.max,
          axisLabel: mode === "relative" ? { formatter: durationLabel } : { formatter: null, hideOverlap: true },
          name: mode === "step" ? "step" : "",
        },
        yAxis: {
          type: built.log ? "log" : "value",
          scale: !built.log,
          min: r ? r.min : null,
          max: r ? r.max : null,
          // An explicit range would label its exact ends (1.6057, 10.861): only the nice ticks are labelled.
          axisLabel: { formatter: bytes ? (v) => L.formatBytes(v) : (v) => L.formatValue(v), showMinLabel: !r, showMaxLabel: !r },
        },
        series: built.series,
      };
      // The axes carry the theme's styles every time: ECharts drops an axis's options when its
      // type changes (value to log, value to time), and the axis would fall back to its defaults.
      option.xAxis = axisOver(this.base.xAxis, option.xAxis);
      option.yAxis = axisOver(this.base.yAxis, option.yAxis);
      if (!this.drawn) {
        this.interactive = !firstLook;
        this.chart.setOption(Object.assign({}, this.base, this.interactive ? this.interaction : null, option), { lazyUpdate: false });
        this.drawn = true;
      } else {
        this.chart.setOption(option, { replaceMerge: ["series"], lazyUpdate: false });
      }
      this._badges(built);
    }

    _badges(built) {
      const out = [];
      if (built.log) out.push(["badge-log", built.autoLog ? "log (auto)" : "log", built.autoLog ? "A series spans more than three orders of magnitude: log scale chosen automatically" : ""]);
      if (built.smoothing === "approx") {
        out.push(["badge-approx", "≈ smoothing", "Smoothed over the downsampled points held for this range, not over every step (the run is longer than the page fetches at full resolution): an approximation. Zoom in for exact smoothing."]);
      }
      if (built.clippedPoints) out.push(["badge-clipped", built.clippedPoints + " beyond y range", "Points beyond the y range (outliers ignored) are marked at the chart's edge; untick 'ignore outliers' to see them all"]);
      const key = out.map((b) => b[1]).join("|");
      if (this.badges.dataset.key === key) return;
      this.badges.dataset.key = key;
      this.badges.textContent = "";
      for (const [cls, text, title] of out) {
        const b = el("span", "badge " + cls, text);
        if (title) b.title = title;
        this.badges.appendChild(b);
      }
    }

    /** The legend: a swatch per run drawn on this chart, and the eval line style when present. */
    setLegend(items, hasEval) {
      const key = items.map((i) => i.name + i.color).join("|") + (hasEval ? "|eval" : "");
      if (this.legend.dataset.key === key) return;
      this.legend.dataset.key = key;
      this.legend.textContent = "";
      for (const it of items) {
        const s = el("span", "lg");
        const sw = el("i", "lg-swatch");
        sw.style.background = it.color;
        s.append(sw, document.createTextNode(it.name));
        this.legend.appendChild(s);
      }
      if (hasEval) {
        const s = el("span", "lg lg-style");
        s.append(el("i", "lg-line"), document.createTextNode("train"), el("i", "lg-line lg-dashed"), document.createTextNode("eval"));
        this.legend.appendChild(s);
      }
    }

    /** Reflect the view's settings in the tools and layout. */
    sync(v) {
      if (this.scaleSelect.value !== v.scale) this.scaleSelect.value = v.scale;
      this.outliersBox.checked = v.ignoreOutliers;
      this.card.classList.toggle("expanded", !!v.expanded);
      this.expandButton.setAttribute("aria-pressed", v.expanded ? "true" : "false");
    }

    png(background) {
      return this.chart.getDataURL({ type: "png", pixelRatio: 2, backgroundColor: background });
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  Object.assign(root.GradmonApp, { ChartCard, themeColors, durationLabel, el });
})(self);
