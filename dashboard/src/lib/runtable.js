/* The run table's logic: default selection, regex filter, the header's `config` as columns. Pure. */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  // Runs shown when the page opens with no run in its URL: the newest ones, one colour each.
  const DEFAULT_RUN_CAP = 10;

  function startOf(info) {
    if (typeof info.first_ts === "number") return info.first_ts;
    return typeof info.last_ts === "number" ? info.last_ts : 0;
  }

  /** Run infos newest first (by start time, then name). */
  function newestFirst(infos) {
    return infos.slice().sort((a, b) => startOf(b) - startOf(a) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /** The runs shown by default: every run, newest first, at most `cap`. */
  function defaultSelection(infos, cap) {
    return newestFirst(infos).slice(0, cap || DEFAULT_RUN_CAP).map((i) => i.name);
  }

  /**
   * A run-name filter from user text: {test(name), error}. Empty text matches everything; text that
   * is not a valid regular expression matches nothing and says why (the table shows it).
   */
  function runFilter(text) {
    if (!text) return { test: () => true, error: null };
    try {
      const re = new RegExp(text, "i");
      return { test: (name) => re.test(name), error: null };
    } catch (e) {
      return { test: () => false, error: e.message };
    }
  }

  /** Nested objects flattened to dotted keys: {opt: {lr: 1}} -> {"opt.lr": 1}; arrays stay values. */
  function flattenConfig(obj, prefix, out) {
    const into = out || {};
    if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
      if (prefix) into[prefix] = obj;
      return into;
    }
    for (const k of Object.keys(obj)) {
      const key = prefix ? prefix + "." + k : k;
      const v = obj[k];
      if (v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) flattenConfig(v, key, into);
      else into[key] = v;
    }
    return into;
  }

  function same(a, b) {
    return JSON.stringify(a) === JSON.stringify(b) || (Number.isNaN(a) && Number.isNaN(b));
  }

  /**
   * The config columns of the given runs ([{name, config}] with `config` already flattened):
   * [{key, differs}], the keys whose values differ between runs (or are missing in some) first,
   * then the others, each group in name order. With fewer than two runs nothing differs.
   */
  function configColumns(rows) {
    const keys = new Set();
    for (const r of rows) for (const k of Object.keys(r.config || {})) keys.add(k);
    const cols = [];
    for (const key of keys) {
      let differs = false;
      const first = rows[0] && rows[0].config ? rows[0].config : {};
      for (const r of rows) {
        const c = r.config || {};
        if (!(key in c) || !(key in first) || !same(c[key], first[key])) differs = true;
      }
      cols.push({ key, differs: differs && rows.length > 1 });
    }
    return cols.sort((a, b) => Number(b.differs) - Number(a.differs) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  /** A config value as table text (strings as they are, the rest as JSON, missing as an em dash). */
  function configText(v) {
    if (v === undefined) return "—";
    if (typeof v === "string") return v;
    if (typeof v === "number" && !Number.isFinite(v)) return String(v);
    return JSON.stringify(v);
  }

  return { DEFAULT_RUN_CAP, newestFirst, defaultSelection, runFilter, flattenConfig, configColumns, configText };
});
