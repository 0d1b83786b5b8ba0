/* Which charts to draw and the ECharts series for one chart: pure functions of the run data. */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode ? Object.assign({}, require("./smoothing.js"), require("./decimate.js")) : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const MARK_COLOR = "#d62728";
  // Charts in this order first; every other numeric field gets its own chart after them.
  const KNOWN = [
    { id: "loss", title: "Loss", fields: ["loss", "eval/loss"] },
    { id: "grad_norm", title: "Gradient norm", fields: ["grad_norm"], logToggle: true, spikes: true },
    { id: "lr", title: "Learning rate", fields: ["lr"] },
    { id: "throughput", title: "Throughput (samples/s)", fields: ["throughput"] },
    { id: "steps_per_sec", title: "Steps per second", fields: ["steps_per_sec"] },
    { id: "step_time", title: "Step time (s)", fields: ["step_time"] },
    { id: "data_time", title: "Data time (s)", fields: ["data_time"] },
  ];

  /** Ordered chart panels for the union of fields present: [{id, title, fields, logToggle, spikes}]. */
  function panelsFor(fields) {
    const present = new Set(fields);
    const used = new Set();
    const panels = [];
    for (const p of KNOWN) {
      const fs = p.fields.filter((f) => present.has(f));
      if (!fs.length) continue;
      fs.forEach((f) => used.add(f));
      panels.push(Object.assign({}, p, { fields: p.fields }));
    }
    const rank = (f) => (f.startsWith("eval/") ? 1 : f.startsWith("system/") ? 2 : 0);
    const rest = fields.filter((f) => !used.has(f)).sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
    for (const f of Array.from(new Set(rest))) {
      panels.push(isBytesField(f) ? { id: f, title: f, fields: [f], unit: "bytes" } : { id: f, title: f, fields: [f] });
    }
    return panels;
  }

  /** Whether a field holds a byte count (`rss_bytes`, `system/device_mem_bytes`, ...). */
  function isBytesField(field) {
    return /(^|[/_])bytes$/.test(field);
  }

  const BYTE_UNITS = ["B", "kB", "MB", "GB", "TB", "PB"];

  /** A byte count in decimal units, 3 significant digits: 1200000000 -> "1.2 GB", 512 -> "512 B". */
  function formatBytes(v) {
    if (typeof v !== "number" || !Number.isFinite(v)) return formatValue(v);
    const a = Math.abs(v);
    let u = 0;
    while (u < BYTE_UNITS.length - 1 && a >= Math.pow(1000, u + 1) * 0.9995) u++;
    const x = v / Math.pow(1000, u);
    return (u === 0 ? String(Math.round(x)) : String(Number(x.toPrecision(3)))) + " " + BYTE_UNITS[u];
  }

  /** A value of `field` as text: byte counts in kB/MB/GB, anything else by formatValue. */
  function formatField(field, v) {
    return isBytesField(field) ? formatBytes(v) : formatValue(v);
  }

  /**
   * Rows of a `layers` record's top-k table for display: [{name, grad_norm, param_norm,
   * update_ratio}] as text (non-finite values named, missing ones "—"), at most `max` rows, in the
   * record's order (largest gradient norm first).
   */
  function layerRows(rec, max) {
    const top = rec && Array.isArray(rec.top) ? rec.top : [];
    return top.slice(0, max > 0 ? max : top.length).map((r) => ({
      name: r && typeof r.name === "string" ? r.name : "?",
      grad_norm: formatValue(r ? r.grad_norm : undefined),
      param_norm: formatValue(r ? r.param_norm : undefined),
      update_ratio: formatValue(r ? r.update_ratio : undefined),
    }));
  }

  function formatValue(v) {
    if (typeof v !== "number") return v === undefined || v === null ? "—" : String(v);
    if (Number.isNaN(v)) return "NaN";
    if (v === Infinity) return "Infinity";
    if (v === -Infinity) return "-Infinity";
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3).replace(/\.?0+e/, "e");
    return String(Number(v.toPrecision(5)));
  }

  /**
   * x coordinate of a step for the axis mode: "step" (the step), "wall" (epoch ms, for a time axis)
   * or "relative" (seconds since the run started). NaN when the run has no wall times.
   */
  function xOf(run, step, mode) {
    if (mode === "wall") return run.tsAt(step) * 1000;
    if (mode === "relative") return run.tsAt(step) - run.startTime;
    return step;
  }

  function usable(v, log) {
    return typeof v === "number" && Number.isFinite(v) && (!log || v > 0);
  }

  /**
   * The ECharts series of one chart panel for the given runs.
   *
   * entries: [{run: RunData, color}]; settings: {xMode, smoothing (EMA weight in [0,1)), log,
   * maxPoints, window}. A curve longer than `maxPoints` is drawn from its points in `window`
   * ({startValue, endValue} in x units, null = all) reduced by min/max decimation to about
   * `maxPoints` (spikes and non-finite points always kept): the chart never holds more points than
   * it has pixels to show, whatever the memory holds.
   * Each data item is [x, y, step]. Non-finite values become a gap-free line (connectNulls) plus a
   * red triangle marker at the last finite value before them (pointing down for -Infinity); spikes
   * (grad-norm chart) become red rings at their value; the clip threshold `max_norm` a dashed line.
   */
  function buildSeries(panel, entries, settings) {
    const mode = settings.xMode || "step";
    const log = !!(panel.logToggle && settings.log);
    const alpha = settings.smoothing || 0;
    const series = [];
    let markerPoints = 0;
    for (const { run, color } of entries) {
      for (const field of panel.fields) {
        const v = run.view(field);
        if (!v.steps.length) continue;
        const isEval = field.startsWith("eval/");
        const xs = v.steps.map((s) => xOf(run, s, mode));
        let raw = [];
        const markers = [];
        let lastFinite = null;
        let pendingFirst = []; // non-finite before any finite value: anchor at the first finite later
        for (let i = 0; i < v.steps.length; i++) {
          const x = xs[i];
          if (!Number.isFinite(x)) continue;
          const y = v.values[i];
          if (usable(y, log)) {
            raw.push([x, y, v.steps[i]]);
            if (lastFinite === null) pendingFirst.forEach((m) => (m.value[1] = y));
            lastFinite = y;
          } else {
            raw.push([x, null, v.steps[i]]);
            if (typeof y === "number" && !Number.isFinite(y)) {
              const m = {
                value: [x, lastFinite === null ? (log ? 1 : 0) : lastFinite, v.steps[i]],
                nonfinite: formatValue(y),
                field,
                symbolRotate: y === -Infinity ? 180 : 0,
              };
              if (lastFinite === null) pendingFirst.push(m);
              markers.push(m);
            }
          }
        }
        const label = isEval ? run.name + " · " + field : run.name;
        const smooth = alpha > 0 && !isEval;
        let smoothed = null;
        if (smooth) {
          const sm = lib.emaDebiased(raw.map((p) => (p[1] === null ? NaN : p[1])), alpha);
          smoothed = raw.map((p, i) => [p[0], Number.isFinite(sm[i]) ? sm[i] : null, p[2]]);
        }
        const shown = displayIndices(raw, settings.maxPoints, settings.window);
        if (shown) {
          raw = shown.map((i) => raw[i]);
          if (smoothed) smoothed = shown.map((i) => smoothed[i]);
        }
        const sparse = raw.length <= 60 || isEval; // a few points: show them as dots, not just a line
        series.push({
          id: run.name + "|" + field + "|raw",
          name: label,
          type: "line",
          data: raw,
          color,
          showSymbol: sparse,
          symbolSize: isEval ? 5 : 3,
          connectNulls: true,
          lineStyle: { width: smooth ? 1 : 1.5, opacity: smooth ? 0.25 : 1, type: isEval ? "dashed" : "solid" },
          itemStyle: { opacity: smooth ? 0.25 : 1 },
          emphasis: { disabled: true },
          z: 2,
          markLine: panel.spikes && run.maxNorm !== null && field === "grad_norm" ? thresholdLine(run.maxNorm, color) : undefined,
        });
        if (smoothed) {
          series.push({
            id: run.name + "|" + field + "|smooth",
            name: label + " (smoothed)",
            type: "line",
            data: smoothed,
            color,
            showSymbol: false,
            connectNulls: true,
            lineStyle: { width: 2 },
            emphasis: { disabled: true },
            z: 3,
          });
        }
        if (markers.length) {
          markerPoints += markers.length;
          series.push({
            id: run.name + "|" + field + "|nonfinite",
            name: label + " non-finite",
            type: "scatter",
            data: markers,
            symbol: "triangle",
            symbolSize: 13,
            itemStyle: { color: MARK_COLOR, borderColor: "#fff", borderWidth: 1 },
            z: 10,
            gradmonRole: "nonfinite",
          });
        }
      }
      if (panel.spikes) {
        const spikes = [];
        for (const m of run.marksOf("spike")) {
          let y = m.value;
          if (!usable(y, log)) {
            const at = run.valueAt("grad_norm", m.step);
            y = at ? at.value : null;
          }
          if (!usable(y, log)) continue; // a non-finite spike already has its triangle
          const x = xOf(run, m.step, mode);
          if (Number.isFinite(x)) spikes.push({ value: [x, y, m.step], spike: m });
        }
        if (spikes.length) {
          series.push({
            id: run.name + "|spikes",
            name: run.name + " spikes",
            type: "scatter",
            data: spikes,
            symbol: "circle",
            symbolSize: 11,
            itemStyle: { color: "rgba(214,39,40,0.15)", borderColor: MARK_COLOR, borderWidth: 2 },
            z: 9,
            gradmonRole: "spike",
          });
        }
      }
    }
    return { series, log, markerPoints };
  }

  /**
   * Indices of `points` ([x, y, step], x ascending) to draw, or null for all: those within the
   * window widened by a quarter on each side (so a small pan shows no hole before the next redraw),
   * decimated min/max to about `maxPoints`, plus one point beyond each edge to keep the line going.
   */
  function displayIndices(points, maxPoints, win) {
    const n = points.length;
    if (!(maxPoints > 0) || n <= maxPoints) return null;
    let lo = 0;
    let hi = n;
    if (win && Number.isFinite(win.startValue) && Number.isFinite(win.endValue)) {
      const pad = (win.endValue - win.startValue) / 4;
      lo = Math.max(0, firstAtLeast(points, win.startValue - pad) - 1);
      hi = Math.min(n, firstAtLeast(points, win.endValue + pad + 1e-9) + 1);
    }
    if (hi - lo <= maxPoints) return range(lo, hi);
    const xs = [];
    const ys = [];
    for (let i = lo; i < hi; i++) {
      xs.push(points[i][0]);
      ys.push(points[i][1] === null ? NaN : points[i][1]);
    }
    return lib.decimateMinMax(xs, ys, maxPoints).kept.map((i) => i + lo);
  }

  function firstAtLeast(points, x) {
    let a = 0;
    let b = points.length;
    while (a < b) {
      const m = (a + b) >> 1;
      if (points[m][0] < x) a = m + 1;
      else b = m;
    }
    return a;
  }

  function range(a, b) {
    const out = [];
    for (let i = a; i < b; i++) out.push(i);
    return out;
  }

  function thresholdLine(maxNorm, color) {
    return {
      silent: true,
      symbol: "none",
      data: [{ yAxis: maxNorm, name: "max_norm" }],
      lineStyle: { color, type: "dashed", width: 1, opacity: 0.8 },
      label: { formatter: "max_norm " + formatValue(maxNorm), position: "insideEndTop", color: "#555" },
    };
  }

  return {
    KNOWN_PANELS: KNOWN, MARK_COLOR, panelsFor, buildSeries, displayIndices, formatValue, formatBytes, formatField,
    isBytesField, layerRows, xOf,
  };
});
