/* The ECharts series and y axis of one chart: a pure function of the run data and view settings. */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const deps = isNode
    ? Object.assign({}, require("./schema.js"), require("./decimate.js"), require("./format.js"), require("./yaxis.js"))
    : root.GradmonLib;
  const api = factory(deps);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const MARK_COLOR = "#d62728";
  const SKIP_COLOR = "#e6891a";
  const ROLLBACK_COLOR = "#7b3fb5"; // automatic recovery's rollbacks: a line and a pin at the restored step
  const OVERFLOW = lib.SCHEMA.OVERFLOW_REASON;
  const QUALITY_RANK = { exact: 0, "lead-in": 1, approx: 2 };

  /**
   * x coordinate of a step for the axis mode: "step" (the step), "wall" (epoch ms, for a time axis)
   * or "relative" (seconds since the run started). NaN when the run has no wall times.
   */
  function xOf(run, step, mode) {
    if (mode === "wall") return run.tsAt(step) * 1000;
    if (mode === "relative") return run.tsAt(step) - run.startTime;
    return step;
  }

  /** The x range {min, max} that `runs` span in x mode `mode` ({min: null, max: null} when empty). */
  function xExtent(runs, mode) {
    let min = Infinity;
    let max = -Infinity;
    for (const run of runs) {
      if (run.firstStep === null) continue;
      const xa = xOf(run, run.firstStep, mode);
      const xb = xOf(run, run.lastStep, mode);
      if (Number.isFinite(xa)) min = Math.min(min, xa);
      if (Number.isFinite(xb)) max = Math.max(max, xb);
    }
    if (!Number.isFinite(min)) return { min: null, max: null };
    if (max <= min) max = min + 1;
    return { min, max };
  }

  function usable(v, log) {
    return typeof v === "number" && Number.isFinite(v) && (!log || v > 0);
  }

  function inWindow(x, win) {
    return !win || (x >= win.startValue && x <= win.endValue);
  }

  /** Whether a field is smoothed: step-record fields only (eval and system points are drawn as they are). */
  function smoothable(field) {
    return !field.startsWith("eval/") && !field.startsWith("system/");
  }

  /**
   * Points [x, y, step] of one field of one run, y null where not drawable (non-finite, or <= 0 on
   * a log axis), and the markers of its non-finite values: a red triangle at the last finite value
   * before them (pointing down for -Infinity), or at the first finite value after them. A loss-scale
   * overflow's non-finite norm gets none: the step is a skip (its diamond, see flagMarks).
   */
  function pointsOf(run, field, steps, values, mode, log) {
    const points = [];
    const markers = [];
    let lastFinite = null;
    const pendingFirst = [];
    for (let i = 0; i < steps.length; i++) {
      const x = xOf(run, steps[i], mode);
      if (!Number.isFinite(x)) continue;
      const y = values[i];
      if (usable(y, log)) {
        points.push([x, y, steps[i]]);
        if (lastFinite === null) pendingFirst.forEach((m) => (m.value[1] = y));
        lastFinite = y;
        continue;
      }
      points.push([x, null, steps[i]]);
      if (typeof y === "number" && !Number.isFinite(y) && !(field !== "loss" && run.overflowAt(steps[i]))) {
        const m = {
          value: [x, lastFinite === null ? (log ? 1 : 0) : lastFinite, steps[i]],
          nonfinite: lib.formatValue(y),
          field,
          symbolRotate: y === -Infinity ? 180 : 0,
        };
        if (lastFinite === null) pendingFirst.push(m);
        markers.push(m);
      }
    }
    return { points, markers };
  }

  /** Keep the points displayIndices picks (all when it returns null). */
  function thin(points, maxPoints, win) {
    const idx = displayIndices(points, maxPoints, win);
    return idx ? idx.map((i) => points[i]) : points;
  }

  /**
   * The chart of one panel for the given runs: {series, log, autoLog, range, markerPoints,
   * clippedPoints, smoothing}.
   *
   * entries: [{run: RunData, color}]; settings: {xMode, smoothing (EMA weight in [0,1)), scale
   * ("auto" | "log" | "linear"), ignoreOutliers, maxPoints, window}. A curve longer than
   * `maxPoints` is drawn from its points in `window` ({startValue, endValue} in x units, null = all)
   * reduced by min/max decimation (spikes and non-finite points always kept): the chart never holds
   * more points than it has pixels to show, whatever the memory holds. Each data item is [x, y,
   * step]. `range` is the y range (yaxis.js; null: let the chart decide); points beyond it get one
   * edge marker per stretch. On a `marks` panel, the detector's flags: spikes as red rings, skips as
   * orange diamonds (at the chart's edge when clipped), and the clip threshold `max_norm` as a
   * dashed line. `smoothing` is the worst quality of the smoothed curves drawn (null when none).
   */
  function buildSeries(panel, entries, settings) {
    const mode = settings.xMode || "step";
    const alpha = settings.smoothing || 0;
    const win = settings.window && Number.isFinite(settings.window.startValue) ? settings.window : null;
    const scale = settings.scale || "auto";
    const lists = [];
    for (const { run } of entries) for (const f of panel.fields) lists.push(run.view(f).values);
    const autoLog = scale === "auto" && lib.autoLog(lists);
    const log = scale === "log" || autoLog;
    const series = [];
    const drawn = []; // [{points in view, run, color}] for the range and the clipped markers
    const flagsOf = []; // [{run, color}] whose detector marks this chart shows
    let markerPoints = 0;
    let quality = null;
    const thresholds = new Set(); // max_norm values with their line drawn: one line (and label) for runs sharing one
    for (const { run, color } of entries) {
      for (const field of panel.fields) {
        const v = run.view(field);
        if (!v.steps.length) continue;
        const isEval = field.startsWith("eval/");
        const { points, markers } = pointsOf(run, field, v.steps, v.values, mode, log);
        const label = isEval ? run.name + " · " + field : run.name;
        let smoothed = null;
        if (alpha > 0 && smoothable(field)) {
          const sm = run.smoothed(field, alpha);
          smoothed = thin(pointsOf(run, field, sm.steps, sm.values, mode, log).points, settings.maxPoints, win);
          if (quality === null || QUALITY_RANK[sm.quality] > QUALITY_RANK[quality]) quality = sm.quality;
        }
        const raw = thin(points, settings.maxPoints, win);
        drawn.push({ points: raw.filter((p) => inWindow(p[0], win)), run, color, field });
        const sparse = raw.length <= 60 || isEval; // a few points: show them as dots, not just a line
        const threshold = panel.marks && run.maxNorm !== null && field === "grad_norm" && !thresholds.has(run.maxNorm);
        if (threshold) thresholds.add(run.maxNorm);
        series.push({
          id: run.name + "|" + field + "|raw",
          name: label,
          type: "line",
          data: raw,
          color,
          showSymbol: sparse,
          symbolSize: isEval ? 5 : 3,
          connectNulls: true,
          lineStyle: { width: smoothed ? 1 : 1.5, opacity: smoothed ? 0.25 : 1, type: isEval ? "dashed" : "solid" },
          itemStyle: { opacity: smoothed ? 0.25 : 1 },
          emphasis: { disabled: true },
          z: 2,
          markLine: threshold ? thresholdLine(run.maxNorm, color) : undefined,
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
          series.push(markerSeries(run.name + "|" + field + "|nonfinite", label + " non-finite", markers, "nonfinite", "triangle", 13));
        }
      }
      if (panel.marks) flagsOf.push({ run, color });
    }
    const range = lib.yRange(
      drawn.map((d) => ({ values: d.points.map((p) => p[1]), skip: d.run.hasFlags() ? (i) => d.run.flagged(d.points[i][2]) : null })),
      log,
      settings.ignoreOutliers !== false,
    );
    let clippedPoints = 0;
    if (range) {
      for (const d of drawn) {
        const stretches = lib.clippedStretches(d.points, range.min, range.max);
        if (!stretches.length) continue;
        clippedPoints += stretches.length;
        series.push(clippedSeries(d, stretches, range));
      }
    }
    for (const { run } of flagsOf) {
      for (const [kind, symbol, color] of [["spike", "circle", MARK_COLOR], ["skip", "diamond", SKIP_COLOR]]) {
        const data = flagMarks(run, kind, mode, log, range);
        if (data.length) series.push(flagSeries(run.name + "|" + kind + "s", run.name + " " + kind + "s", data, kind, symbol, color));
      }
    }
    for (const { run } of entries) {
      const rb = rollbackMarks(run, panel.fields[0], mode, log, range);
      if (rb) series.push(rb);
    }
    return { series, log, autoLog, range, markerPoints, clippedPoints, smoothing: quality };
  }

  /**
   * A run's rollbacks (automatic recovery) on any chart: a dashed vertical line at the restored step
   * and a marker on the curve there, whose tooltip mark gives the event's message (the reason, the
   * restored step, the batches skipped). Null when the run has none.
   */
  function rollbackMarks(run, field, mode, log, range) {
    const data = [];
    for (const ev of run.rollbacks()) {
      const x = xOf(run, ev.step, mode);
      if (!Number.isFinite(x)) continue;
      const at = run.valueAt(field, ev.step);
      let y = at && usable(at.value, log) ? at.value : range ? range.max : null;
      if (y === null) continue;
      if (range) y = Math.min(range.max, Math.max(range.min, y));
      const reason = typeof ev.message === "string" ? ev.message : "to step " + ev.step;
      data.push({ value: [x, y, ev.step], mark: { kind: "rollback", step: ev.step, reason } });
    }
    if (!data.length) return null;
    return {
      id: run.name + "|rollbacks", name: run.name + " rollbacks", type: "scatter", data, symbol: "pin", symbolSize: 14,
      itemStyle: { color: ROLLBACK_COLOR }, z: 11, clip: false, gradmonRole: "rollback",
      markLine: {
        silent: true, symbol: "none", data: data.map((d) => ({ xAxis: d.value[0] })),
        lineStyle: { color: ROLLBACK_COLOR, type: "dashed", width: 1 }, label: { show: false },
      },
    };
  }

  /**
   * The detector marks of one kind on a marks chart: at the flagged step's value, clamped into the
   * range. A loss-scale overflow (a skip whose norm is non-finite) sits at the top of the range.
   */
  function flagMarks(run, kind, mode, log, range) {
    const data = [];
    for (const m of run.marksOf(kind)) {
      let y = m.value;
      if (!usable(y, log)) {
        const at = run.valueAt("grad_norm", m.step);
        y = at ? at.value : null;
      }
      let trueValue = y;
      if (!usable(y, log) && m.reason === OVERFLOW && range) {
        trueValue = m.value; // as measured (non-finite), drawn at the top
        y = range.max;
      }
      if (!usable(y, log)) continue; // a non-finite flagged step already has its triangle
      const x = xOf(run, m.step, mode);
      if (!Number.isFinite(x)) continue;
      const shown = range ? Math.min(range.max, Math.max(range.min, y)) : y;
      data.push({ value: [x, shown, m.step], mark: m, trueValue });
    }
    return data;
  }

  function markerSeries(id, name, data, role, symbol, size) {
    return {
      id, name, type: "scatter", data, symbol, symbolSize: size,
      itemStyle: { color: MARK_COLOR, borderColor: "#fff", borderWidth: 1 }, z: 10, gradmonRole: role,
    };
  }

  function flagSeries(id, name, data, role, symbol, color) {
    return {
      id, name, type: "scatter", data, symbol, symbolSize: role === "spike" ? 9 : 7,
      itemStyle: { color: role === "spike" ? "rgba(214,39,40,0.12)" : color, borderColor: color, borderWidth: role === "spike" ? 1.5 : 0 },
      z: 9, clip: false, gradmonRole: role,
    };
  }

  /** Edge markers of a series' clipped stretches: a small arrowhead at the top (or bottom) edge. */
  function clippedSeries(d, stretches, range) {
    return {
      id: d.run.name + "|" + d.field + "|clipped",
      name: d.run.name + " beyond the y range",
      type: "scatter",
      data: stretches.map((s) => ({
        value: [s.x, s.side === "above" ? range.max : range.min, s.step],
        clipped: s,
        symbolRotate: s.side === "above" ? 0 : 180,
        symbolOffset: [0, s.side === "above" ? 5 : -5],
      })),
      symbol: "triangle",
      symbolSize: [9, 7],
      itemStyle: { color: d.color, borderColor: "#fff", borderWidth: 0.5 },
      z: 8,
      clip: false,
      gradmonRole: "clipped",
    };
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
      label: { formatter: "max_norm " + lib.formatValue(maxNorm), position: "insideEndTop", color: "#888" },
    };
  }

  return { MARK_COLOR, ROLLBACK_COLOR, SKIP_COLOR, buildSeries, displayIndices, xOf, xExtent, smoothable };
});
