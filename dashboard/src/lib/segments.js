/* The segments of a run as the page follows it live: which steps a new segment replaces. Pure.
 *
 * The rule (docs/format.md, "Segments"): the latest segment wins, step by step. A segment covers
 * its first to its latest step; what older segments logged at covered steps goes, the rest stays.
 * Live, each step of the current segment extends its cover, and `extend` says which steps it newly
 * covers where something may be held; RunData (rundata.js) drops what older segments hold there.
 * Marks and events are tagged with the segment that brought them (`tag`), so that a segment's own
 * records are never dropped; what a history response brought is older than any live segment.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const FROM_HISTORY = -1; // the tag of what a history response brought

  class SegmentCover {
    constructor() {
      this.segment = 0; // bumped by each new header
      this.first = null; // the current segment's cover so far: [first, last]
      this.last = null;
      this.maxStep = -Infinity; // the largest step held: a step beyond it replaces nothing
      this.fromServer = false; // while a history response is taken in
    }

    /** A new header: a new segment, covering nothing yet. */
    newSegment() {
      this.segment++;
      this.first = null;
      this.last = null;
    }

    /** The history's `latest_segment` ({first_step, last_step}): the current segment's cover so far. */
    continueFrom(latest) {
      if (latest && typeof latest.last_step === "number") {
        this.first = latest.first_step;
        this.last = latest.last_step;
      }
    }

    /** Something is held at `step`. */
    held(step) {
      if (typeof step === "number" && step > this.maxStep) this.maxStep = step;
    }

    /**
     * A step record of the current segment: extend its cover. Returns [from, to], the steps newly
     * covered where older data may be held, or null (nothing to replace: a step repeated or going
     * back within the segment, or beyond everything held).
     */
    extend(step) {
      let from = step;
      if (this.last === null) this.first = step;
      else if (step > this.last) from = this.last + 1;
      else return null;
      this.last = step;
      return from <= this.maxStep ? [from, step] : null;
    }

    /** The tag of what is taken in now. */
    tag() {
      return this.fromServer ? FROM_HISTORY : this.segment;
    }

    /** Whether a tag is an older segment's than the current one (untagged: from history). */
    older(tag) {
      return (tag === undefined ? FROM_HISTORY : tag) < this.segment;
    }
  }

  return { FROM_HISTORY, SegmentCover };
});
