/* A run's status as the run table shows it, with how far the server has read a run whose log it is
 * still indexing (a big run's first index). Pure. */
(function (root, factory) {
  "use strict";
  const isNode = typeof module !== "undefined" && module.exports;
  const api = factory(isNode ? require("./format.js") : root.GradmonLib);
  if (isNode) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function (lib) {
  "use strict";

  /**
   * A run's status as the table shows it ({text, cls, title}): its `status`, or, while the server is
   * still reading the file's existing content (`indexing`: its first index of a big run), how far
   * that reading has come (`cursor.offset` of `file_bytes`, from the run's entry and the server's
   * `indexing` messages): its curves show what had been read when they were fetched until then.
   */
  function runStatus(info) {
    if (!info.indexing) {
      const status = info.status === undefined || info.status === null ? "" : String(info.status);
      return { text: status, cls: status, title: "" };
    }
    const read = info.cursor ? info.cursor.offset : null;
    const size = info.file_bytes;
    const known = typeof read === "number" && typeof size === "number" && size > 0;
    // (floor, at most 99 %: "100 %" only once the reading has ended and the status shows instead)
    const pct = known ? Math.min(99, Math.floor((100 * read) / size)) : null;
    const upTo = typeof info.last_step === "number" ? " (up to step " + info.last_step + " so far)" : "";
    return {
      text: pct === null ? "reading" : "reading " + pct + "%",
      cls: "indexing",
      title: "The server is still reading this run's log" + (known ? ": " + lib.formatBytes(read) + " of " + lib.formatBytes(size) : "") + upTo +
        ". Its curves show what had been read when they were fetched and are completed when the reading is done.",
    };
  }

  return { runStatus };
});
