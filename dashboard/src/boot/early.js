/* The page's first requests, sent before ECharts and the page's own script are parsed: index.html
 * loads this small script first, in <head>, before anything is drawn (the build bundles it with the
 * lib/ modules it requires as static/early.js). It asks for the run list at once and, as soon as
 * the list is in, for the histories of the runs shown at opening (the URL's, or the default
 * selection), so the server answers them while the browser parses the rest. app/feed.js takes the
 * answers (self.GradmonEarly) instead of asking again. The decisions are lib/opening.js's, the
 * same the page makes. Browser only.
 */
"use strict";
const O = require("../lib/opening.js");

(function (root) {
  // Opened from disk or as a static export: no server to ask (export-data.js runs before this).
  if (root.GRADMON_EXPORT || location.protocol === "file:" || typeof fetch !== "function") return;
  const plan = O.openingPlan(location.search);
  // Each answer is read and parsed as soon as it arrives, and handed over so ({ok, status, body}):
  // the page then takes the list and the histories with no wait of its own for their bodies, and
  // its first draw can follow in the task that took them, not a few tasks (and a frame) later.
  const get = (path, params) => {
    const answer = fetch(O.apiUrl(location.href, path, params, plan.token), { cache: "no-store" }).then(async (resp) => ({
      ok: resp.ok,
      status: resp.status,
      body: await resp.json().catch(() => null),
    }));
    answer.catch(() => {}); // a failure is the page's to see when it takes the answer
    return answer;
  };
  const histories = new Map();
  // The charts' width decides the points asked for: read once #charts is parsed and laid out
  // (the list's answer almost always comes after that; else a few ms later).
  const laidOut = () =>
    new Promise(function wait(resolve) {
      const charts = document.getElementById("charts");
      if (charts || document.readyState !== "loading") resolve(charts);
      else setTimeout(() => wait(resolve), 4);
    });
  // The list's answer is handed over only once those requests are out, so the page, reading the
  // same list, finds them sent and sends none twice.
  let runs = get("/api/runs").then(async (answer) => {
    const body = answer.ok ? answer.body : null;
    const names = body && Array.isArray(body.runs) ? O.runsAfterList(plan, body.runs) : [];
    if (names.length) {
      const charts = await laidOut();
      const points = O.historyPoints(O.chartWidthIn(charts ? charts.clientWidth : 0), plan.points, names.length);
      for (const name of names) histories.set(name, get(O.runPath(name, "/history"), { points }));
    }
    return answer;
  });
  runs.catch(() => {});

  root.GradmonEarly = {
    /** The run list's answer under way (a promise of {ok, status, body}), once (null after: ask again). */
    runs() {
      const r = runs;
      runs = null;
      return r;
    },
    /** A run's history answer under way ({ok, status, body}), once; null when none was sent. */
    history(name) {
      const r = histories.get(name) || null;
      histories.delete(name);
      return r;
    },
  };
})(self);
