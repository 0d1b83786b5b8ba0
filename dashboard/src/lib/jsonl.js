/* JSON Lines decoding of gradmon run-log records (docs/format.md), for the browser and node.
 *
 * Mirrors gradmon/logformat/jsonl.py: non-finite floats arrive as the strings "NaN", "Infinity", "-Infinity"
 * and are decoded back to numbers everywhere except in text fields. A trailing partial line (no
 * "\n" yet) is never taken as a record. Logs of other writers are read by the format's
 * compatibility rules: a line without `type` but with an integer `step` is a step record, and the
 * bare tokens NaN / Infinity / -Infinity of Python's default json.dumps (not JSON) are read too.
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
  // schema.py's INT_MIN..INT_MAX (the signed 64-bit integers) as doubles. JSON.parse rounds the 512
  // integers up to INT_MAX = 2^63 - 1 to 2^63 (INT_END): those are refused here, taken by the server.
  const INT_END = 2 ** 63;
  const INT_MIN = -INT_END;
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

  /**
   * A record as the readers see it: a JSON object without `type` but with an integer `step` (what
   * hand-written callbacks write) is a step record. Anything else is returned as it is.
   */
  function normalizeRecord(rec) {
    if (rec !== null && typeof rec === "object" && !Array.isArray(rec) && rec.type === undefined && Number.isInteger(rec.step)) {
      return Object.assign({ type: "step" }, rec);
    }
    return rec;
  }

  const STRING_LITERAL = /"(?:[^"\\]|\\.)*"/g;
  const BARE_TOKEN = /-?Infinity|NaN/g;

  /**
   * The line with bare NaN / Infinity / -Infinity tokens outside string literals quoted, so that
   * JSON.parse takes them (and decodeNonFinite turns them into numbers). Text inside strings is
   * never touched. Only called for a line JSON.parse has already refused.
   */
  function quoteBareTokens(line) {
    let out = "";
    let last = 0;
    STRING_LITERAL.lastIndex = 0;
    for (let m = STRING_LITERAL.exec(line); m; m = STRING_LITERAL.exec(line)) {
      out += line.slice(last, m.index).replace(BARE_TOKEN, '"$&"') + m[0];
      last = m.index + m[0].length;
    }
    return out + line.slice(last).replace(BARE_TOKEN, '"$&"');
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
      if (v !== undefined && v !== null && !(v >= INT_MIN && v < INT_END)) {
        return `field '${k}' is outside the signed 64-bit integers`;
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

  function parseLine(line) {
    try {
      return JSON.parse(line);
    } catch (e) {
      // Python's json.dumps writes bare NaN / Infinity: not JSON, read all the same (never written).
      if (line.indexOf("NaN") >= 0 || line.indexOf("Infinity") >= 0) {
        try {
          return JSON.parse(quoteBareTokens(line));
        } catch (e2) {
          // fall through: the line is malformed for another reason
        }
      }
      throw new Error("not JSON: " + e.message);
    }
  }

  /** Decode and validate one line (without its newline). Returns the record or throws an Error. */
  function decodeLine(line) {
    const rec = normalizeRecord(decodeNonFinite(parseLine(line)));
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

  return { NONFINITE, TEXT_KEYS, decodeNonFinite, decodeNumber, normalizeRecord, quoteBareTokens, recordError, decodeLine, parseJsonl };
});
