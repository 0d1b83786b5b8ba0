/* The forensics of an alarm (docs/format.md, "Forensics"): what the alarm detail view shows. Pure.
 *
 * An `alarm` event may carry what the step cell kept of the alarm's step:
 *   "forensics": {"step": S, "layers": [{"name", "grad_norm"}, ...largest first], "layer_count": N,
 *                 "rank_norms": [r0, r1, ...], "top_rank": R, "sample_ids": [[ids of rank 0], ...],
 *                 "grouped": false, "missing": "...", "error": "..."}
 * every field but `step` optional. This module turns it into rows to draw: bar widths as fractions
 * of the largest value, the ranks' strip with the top rank marked, the sample ids as text.
 */
(function (root, factory) {
  "use strict";
  if (typeof module !== "undefined" && module.exports) module.exports = factory(require("./schema.js"));
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), factory(root.GradmonLib));
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const FORENSICS_FIELD = lib.SCHEMA.FORENSICS_FIELD;
  const MAX_IDS_SHOWN = 64; // ids written out per rank; the rest are counted

  function isNumber(v) {
    return typeof v === "number" && !Number.isNaN(v);
  }

  /** Bar fractions in [0, 1] of `values` against their largest finite one; a non-finite value is a full bar. */
  function fractions(values) {
    let top = 0;
    for (const v of values) if (isNumber(v) && Number.isFinite(v) && Math.abs(v) > top) top = Math.abs(v);
    return values.map((v) => (!isNumber(v) || !Number.isFinite(v) ? 1 : top > 0 ? Math.abs(v) / top : 0));
  }

  /** `ids` as text: comma-separated, at most `max` of them, then "… +N more". */
  function idsText(ids, max) {
    const limit = max > 0 ? max : MAX_IDS_SHOWN;
    const shown = ids.slice(0, limit).join(", ");
    return ids.length > limit ? shown + ", … +" + (ids.length - limit) + " more" : shown;
  }

  /**
   * The view model of an alarm event's forensics, or null when it has none:
   * {step, layers: [{name, value, frac, nonfinite}], moreLayers, grouped,
   *  ranks: [{rank, value, frac, top, nonfinite}], topRank, samples: [{rank, ids, text, top}],
   *  note}. `note`: why something is absent (the step left the ring, a read failed).
   */
  function forensicsView(alarm) {
    const f = alarm && alarm[FORENSICS_FIELD];
    if (!f || typeof f !== "object") return null;
    const rows = Array.isArray(f.layers) ? f.layers.filter((r) => r && typeof r === "object") : [];
    const layerFracs = fractions(rows.map((r) => r.grad_norm));
    const layers = rows.map((r, i) => ({
      name: typeof r.name === "string" ? r.name : "?",
      value: r.grad_norm,
      frac: layerFracs[i],
      nonfinite: typeof r.grad_norm !== "number" || !Number.isFinite(r.grad_norm),
    }));
    const count = Number.isInteger(f.layer_count) ? f.layer_count : layers.length;
    const norms = Array.isArray(f.rank_norms) ? f.rank_norms : [];
    const topRank = Number.isInteger(f.top_rank) ? f.top_rank : norms.length ? largestIndex(norms) : null;
    const rankFracs = fractions(norms);
    const ranks = norms.map((v, rank) => ({
      rank, value: v, frac: rankFracs[rank], top: rank === topRank,
      nonfinite: typeof v !== "number" || !Number.isFinite(v),
    }));
    const samples = [];
    if (Array.isArray(f.sample_ids)) {
      f.sample_ids.forEach((ids, rank) => {
        if (!Array.isArray(ids)) return;
        samples.push({ rank, ids: ids.slice(), text: idsText(ids), top: rank === topRank && f.sample_ids.length > 1 });
      });
    }
    const notes = [f.missing, f.error].filter((t) => typeof t === "string" && t);
    return {
      step: Number.isInteger(f.step) ? f.step : alarm.step,
      layers,
      moreLayers: Math.max(0, count - layers.length),
      grouped: f.grouped === true,
      ranks,
      topRank,
      samples,
      note: notes.join(" · "),
    };
  }

  function largestIndex(values) {
    let best = 0;
    for (let i = 1; i < values.length; i++) {
      const v = values[i];
      const b = values[best];
      const vBad = typeof v !== "number" || !Number.isFinite(v);
      const bBad = typeof b !== "number" || !Number.isFinite(b);
      if ((vBad && !bBad) || (!vBad && !bBad && v > b)) best = i;
    }
    return best;
  }

  /** One short phrase for the banner line: "top layer X · rank R" (null without forensics). */
  function forensicsSummary(alarm) {
    const v = forensicsView(alarm);
    if (!v) return null;
    const parts = [];
    if (v.layers.length) parts.push((v.grouped ? "top group " : "top layer ") + v.layers[0].name);
    if (v.ranks.length > 1 && v.topRank !== null) parts.push("rank " + v.topRank);
    return parts.length ? parts.join(" · ") : null;
  }

  return { FORENSICS_FIELD, forensicsView, forensicsSummary, idsText, fractions };
});
