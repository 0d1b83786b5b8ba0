/* Strict JSON Lines decoding of gradmon run-log records (docs/format.md), for the browser and node.
 *
 * Mirrors gradmon/jsonl.py: non-finite floats arrive as the strings "NaN", "Infinity", "-Infinity"
 * and are decoded back to numbers everywhere except in text fields; bare NaN tokens are not JSON
 * and make the line invalid. A trailing partial line (no "\n" yet) is never taken as a record.
 */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const api = factory(isNode ? require("./schema.js") : root.GradmonLib);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  const NONFINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

  const TEXT_KEYS = new Set(lib.SCHEMA.TEXT_KEYS);
  const INT_FIELDS = lib.SCHEMA.INT_FIELDS;
  const NUMBER_FIELDS = lib.SCHEMA.NUMBER_FIELDS;

  /** Turn "NaN"/"Infinity"/"-Infinity" strings back into numbers, recursively, except under text keys. */
  function decodeNonFinite(value) {
    if (typeof value === "string") return Object.prototype.hasOwnProperty.call(NONFINITE, value) ? NONFINITE[value] : value;
    if (Array.isArray(value)) return value.map(decodeNonFinite);
    if (value !== null && typeof value === "object") {
      const out = {};
      for (const k of Object.keys(value)) out[k] = TEXT_KEYS.has(k) ? value[k] : decodeNonFinite(value[k]);
      return out;
    }
    return value;
  }

  /** Decode one wire value that should be a number: a number or one of the three non-finite strings. */
  function decodeNumber(v) {
    if (typeof v === "number") return v;
    if (typeof v === "string" && Object.prototype.hasOwnProperty.call(NONFINITE, v)) return NONFINITE[v];
    return undefined;
  }

  /** Check the fields every reader relies on; return an error message or null when valid. */
  function recordError(rec) {
    if (rec === null || typeof rec !== "object" || Array.isArray(rec)) return "a record is a JSON object";
    if (typeof rec.type !== "string" || rec.type === "") return "record has no string 'type'";
    for (const k of INT_FIELDS) {
      const v = rec[k];
      if (v !== undefined && v !== null && !(typeof v === "number" && Number.isInteger(v))) {
        return `field '${k}' must be an integer`;
      }
    }
    for (const k of NUMBER_FIELDS) {
      const v = rec[k];
      if (v !== undefined && v !== null && typeof v !== "number") return `field '${k}' must be a number`;
    }
    if (rec.type === "step" && !(typeof rec.step === "number" && Number.isInteger(rec.step))) {
      return "a step record needs an integer 'step'";
    }
    return null;
  }

  /** Decode and validate one line (without its newline). Returns the record or throws an Error. */
  function decodeLine(line) {
    let raw;
    try {
      raw = JSON.parse(line); // rejects bare NaN / Infinity tokens: they are not JSON
    } catch (e) {
      throw new Error("not JSON: " + e.message);
    }
    const rec = decodeNonFinite(raw);
    const err = recordError(rec);
    if (err) throw new Error(err);
    return rec;
  }

  /**
   * Parse a chunk of JSON Lines text.
   *
   * Returns {records, skipped, errors, rest}: `rest` is the trailing text after the last "\n" (a line
   * still being written), never parsed; with `final: true` a non-empty rest is counted as skipped
   * (a partial last line of a finished file). Blank lines are ignored; invalid lines are counted in
   * `skipped` and the first few reasons kept in `errors` ({line, error}).
   */
  function parseJsonl(text, options) {
    const final = !!(options && options.final);
    const firstLine = (options && options.firstLine) || 1;
    const records = [];
    const errors = [];
    let skipped = 0;
    let pos = 0;
    let lineNo = firstLine;
    for (;;) {
      const nl = text.indexOf("\n", pos);
      if (nl < 0) break;
      let line = text.slice(pos, nl);
      pos = nl + 1;
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line.trim() !== "") {
        try {
          records.push(decodeLine(line));
        } catch (e) {
          skipped++;
          if (errors.length < 20) errors.push({ line: lineNo, error: e.message });
        }
      }
      lineNo++;
    }
    let rest = text.slice(pos);
    let partial = false;
    if (final && rest.trim() !== "") {
      skipped++;
      partial = true;
      if (errors.length < 20) errors.push({ line: lineNo, error: "partial last line (no newline)" });
      rest = "";
    }
    return { records, skipped, errors, rest, partial };
  }

  return { NONFINITE, TEXT_KEYS, decodeNonFinite, decodeNumber, recordError, decodeLine, parseJsonl };
});
