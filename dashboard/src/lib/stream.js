/* The page's side of the stream protocol (docs/protocol.md): pure decisions, no I/O.
 *
 * Each followed run has a small state, owned by the app: {loading, cursor, awaitingCatchUp,
 * awaitingFile}. `cursor` is the file position up to which the page holds the run complete (from
 * the history response, then from each applied `records` message). The functions below look at
 * that state and a server message and return what to do; the app carries the action out (fetch the
 * history, send a subscribe, ingest records) and updates the state with `applied`/`loaded`.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  /** A fresh state for a run the page starts following (its history is about to be fetched). */
  function newStreamState() {
    return { loading: false, reloadAfter: false, cursor: null, awaitingCatchUp: false, awaitingFile: false };
  }

  /**
   * A history fetch is wanted (first load, reset, lagged, another generation). Returns "fetch"
   * when none is in flight (the state is then loading), else "queued": the one in flight may
   * predate what made us ask, so a second fetch follows it (see `loaded`).
   */
  function requestLoad(st) {
    if (st.loading) {
      st.reloadAfter = true;
      return "queued";
    }
    st.loading = true;
    return "fetch";
  }

  /**
   * The history fetch is done (`cursor` from its response, or null when it failed). Returns
   * "refetch" when another load was asked for meanwhile, else "subscribe": stream from the cursor.
   */
  function loaded(st, cursor) {
    st.loading = false;
    if (cursor !== undefined) st.cursor = cursor || null;
    st.awaitingFile = false;
    if (st.reloadAfter) {
      st.reloadAfter = false;
      st.loading = true;
      return "refetch";
    }
    return "subscribe";
  }

  /**
   * What to do with a `records` message for a run in state `st` (null: not followed).
   *
   * - "ignore": the history fetch (then subscribe) covers it, or every record is already held
   *   (an earlier message re-sent after a resubscribe);
   * - "apply": ingest its records; `cursor` is the run's new cursor. A message that starts before
   *   our cursor but ends beyond it is applied whole: records merge by step, none doubles;
   * - "resubscribe": it starts beyond our cursor (records queued before our subscribe took effect,
   *   or lost): drop it and ask the server to resend from our cursor;
   * - "wait": the same, with a resubscribe already sent (its catch-up will fill the gap);
   * - "reload": it belongs to another generation of the file: start over from the history.
   */
  function recordsAction(st, msg) {
    if (!st || st.loading || !st.cursor) return { action: "ignore" };
    const cur = st.cursor;
    const prev = msg.prev;
    const next = msg.cursor;
    if (prev && prev.gen !== cur.gen) return { action: "reload" };
    if (prev && prev.offset > cur.offset) return { action: st.awaitingCatchUp ? "wait" : "resubscribe" };
    if (prev && next && next.gen === cur.gen && next.offset <= cur.offset) return { action: "ignore" };
    return { action: "apply", cursor: advance(cur, next) };
  }

  /** The cursor after applying a message that ends at `next` (never moves backwards in one generation). */
  function advance(cur, next) {
    if (!next) return cur;
    if (!cur || next.gen !== cur.gen || next.offset > cur.offset) return next;
    return cur;
  }

  /** Record that a message was applied (the stream is in step again: a later gap means lost records). */
  function applied(st, cursor) {
    st.cursor = cursor;
    st.awaitingCatchUp = false;
  }

  /**
   * The runs to (re)subscribe and their cursors: {name: cursor} for every followed run that holds a
   * cursor and is not loading. `states` is a Map name -> state; `only` limits it to one name.
   */
  function subscribeCursors(states, only) {
    const out = {};
    for (const [name, st] of states) {
      if (only !== undefined && name !== only) continue;
      if (st && !st.loading && st.cursor) out[name] = st.cursor;
    }
    return out;
  }

  /** A subscribe carrying these runs was sent: their gaps are now being filled by the server. */
  function subscribed(states, names) {
    for (const n of names) {
      const st = states.get(n);
      if (st) st.awaitingCatchUp = true;
    }
  }

  /**
   * `hello` (a new connection): the names of followed runs whose file is another generation than
   * our cursor's (a server restart with a replaced file): reload those; resubscribe every run.
   */
  function helloReloads(states, infos) {
    const out = [];
    for (const info of infos || []) {
      const st = states.get(info.name);
      if (st && !st.loading && st.cursor && info.cursor && info.cursor.gen !== st.cursor.gen) out.push(info.name);
    }
    for (const st of states.values()) st.awaitingCatchUp = false;
    return out;
  }

  /**
   * `reset`: "await-file" when the file was truncated or replaced by one with no complete line yet
   * (drop the data; fetch again once the run lists a generation), "reload" otherwise, "ignore" for
   * a run we do not follow.
   */
  function resetAction(st, msg) {
    if (!st) return "ignore";
    if (msg.cursor && msg.cursor.gen === null) {
      st.cursor = null;
      st.awaitingFile = true;
      return "await-file";
    }
    return "reload";
  }

  /** A `runs` entry for a run awaiting its new file: reload once the file has a generation. */
  function fileArrived(st, info) {
    return !!(st && st.awaitingFile && info && info.cursor && info.cursor.gen);
  }

  /**
   * History requests sent before the run list comes. The runs the page's URL names are known at
   * once: their requests go out beside the list's instead of after it (the first chart's data one
   * round trip sooner). Not with smoothing on: how many points to ask for then depends on the
   * run's size, which the list gives. `ask(name)` -> a promise of the run's history answer.
   * `sentBefore(name)` -> such a promise for a request sent before the page's scripts ran (boot/
   * early.js: the default selection's, as soon as the list came), once, or null.
   */
  class EarlyHistory {
    constructor(named, smoothing, ask, sentBefore) {
      this.pending = new Map();
      this.sentBefore = sentBefore || null;
      if (!named || smoothing > 0) return;
      for (const name of named) {
        const request = ask(name);
        request.catch(() => {}); // a failure is take()'s to see, or nobody's
        this.pending.set(name, request);
      }
    }

    /**
     * The early answer for a run's first load, once: a promise of it, or of null when there is
     * none, it failed (ask again), or `fullResolution` is wanted (more points than were asked for).
     */
    take(name, fullResolution) {
      let request = this.pending.get(name);
      this.pending.delete(name);
      if (!request && this.sentBefore) {
        request = this.sentBefore(name);
        if (request) request.catch(() => {});
      }
      if (!request || fullResolution) return Promise.resolve(null);
      return request.then((answer) => answer || null, () => null);
    }

    /** The run list came: answers not taken by then are for runs it lacks (or their 404s). */
    clear() {
      this.pending.clear();
      this.sentBefore = null;
    }
  }

  return {
    newStreamState, requestLoad, loaded, recordsAction, advance, applied, subscribeCursors, subscribed,
    helloReloads, resetAction, fileArrived, EarlyHistory,
  };
});
