/* Which charts to draw, and the sections they are grouped in. Pure. */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const api = factory(isNode ? require("./format.js") : root.GradmonLib);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  // Charts in this order first; every other numeric field gets its own chart after them.
  // `marks`: the chart shows the detector's flags (spike / skip) and the clip threshold.
  const KNOWN = [
    { id: "loss", title: "Loss", fields: ["loss", "eval/loss"], section: "train" },
    { id: "grad_norm", title: "Gradient norm", fields: ["grad_norm"], marks: true, section: "train" },
    { id: "lr", title: "Learning rate", fields: ["lr"], section: "train" },
    { id: "throughput", title: "Throughput (samples/s)", fields: ["throughput"], section: "system" },
    { id: "steps_per_sec", title: "Steps per second", fields: ["steps_per_sec"], section: "system" },
    { id: "step_time", title: "Step time (s)", fields: ["step_time"], section: "system" },
    { id: "data_time", title: "Data time (s)", fields: ["data_time"], section: "system" },
  ];
  // Step-record fields of the clipping / skipping / spike defence.
  const DEFENCE_FIELDS = new Set(["clip_coef", "zscore", "loss_scale"]);
  const SECTION_TITLES = { train: "Training", eval: "Evaluation", defence: "Defence", system: "System" };
  const FIXED_FIRST = ["train", "eval"];
  const FIXED_LAST = ["defence", "system"];

  /**
   * The section of a field's chart: `eval/…` eval, `system/…` system, the defence fields defence,
   * a name with a prefix (`attn/entropy`) the prefix's own section, anything else train.
   */
  function sectionOf(field) {
    if (field.startsWith("eval/")) return "eval";
    if (field.startsWith("system/")) return "system";
    if (DEFENCE_FIELDS.has(field)) return "defence";
    const slash = field.indexOf("/");
    return slash > 0 ? field.slice(0, slash) : "train";
  }

  /** Ordered chart panels for the union of fields present: [{id, title, fields, section, marks, unit}]. */
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
      const panel = { id: f, title: f, fields: [f], section: sectionOf(f) };
      if (lib.isBytesField(f)) panel.unit = "bytes";
      panels.push(panel);
    }
    return panels;
  }

  /**
   * Panels grouped in sections, in order: train, eval, the name-prefix sections (alphabetical),
   * defence, system; empty sections left out. [{id, title, panels}].
   */
  function sectionsFor(panels) {
    const by = new Map();
    for (const p of panels) {
      if (!by.has(p.section)) by.set(p.section, []);
      by.get(p.section).push(p);
    }
    const prefixes = Array.from(by.keys()).filter((s) => !FIXED_FIRST.includes(s) && !FIXED_LAST.includes(s)).sort();
    return FIXED_FIRST.concat(prefixes, FIXED_LAST)
      .filter((s) => by.has(s))
      .map((s) => ({ id: s, title: SECTION_TITLES[s] || s, panels: by.get(s) }));
  }

  return { KNOWN_PANELS: KNOWN, DEFENCE_FIELDS, sectionOf, panelsFor, sectionsFor };
});
