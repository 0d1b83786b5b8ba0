/* Numbers as text: values, byte counts, and the rows of a `layers` table. Pure. */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  /** A value as short text: non-finite values named, 5 significant digits, exponents when tiny or huge. */
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

  return { formatValue, formatBytes, formatField, isBytesField, layerRows };
});
