/* When the chart board redraws, and how much of it per animation frame. Pure (times are passed in).
 *
 * A redraw ("pass") brings every chart near the viewport up to date. A pass the live stream asked
 * for draws its charts a slice per animation frame, each slice ending once it has used SLICE_MS of
 * script time (at least one chart each), so no frame holds the main thread for long: the canvas of
 * each chart is also rasterised in the frame that drew it, and one 8-chart pass in one task was a
 * 70–150 ms long task. A pass the reader asked for (opening, zoom, settings) is drawn in one go:
 * its result is wanted as soon as possible, and slicing it made loading 5–10 % slower.
 *
 * Passes start at most every MIN_GAP_MS. A pass asked for by the live stream (new records) also
 * waits STREAM_LOAD times the script time the last pass took after that pass ended, so streaming
 * redraws use at most about 1 / (1 + STREAM_LOAD) of the main thread whatever the number of charts,
 * runs and points, or the machine's speed. A pass asked for by the reader (zoom, settings,
 * selection, scrolling) waits only for MIN_GAP_MS.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else Object.assign((root.GradmonLib = root.GradmonLib || {}), api);
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  const MIN_GAP_MS = 100; // at most 10 passes per second
  const STREAM_LOAD = 3; // streaming: wait 3x the last pass's script time after it (<= ~25 % busy)
  const SLICE_MS = 8; // streaming: script time per animation frame (a chart and its raster then fit in a 60 Hz frame)

  class RedrawPacer {
    constructor(options) {
      const o = options || {};
      this.minGapMs = o.minGapMs !== undefined ? o.minGapMs : MIN_GAP_MS;
      this.streamLoad = o.streamLoad !== undefined ? o.streamLoad : STREAM_LOAD;
      this.sliceMs = o.sliceMs !== undefined ? o.sliceMs : SLICE_MS;
      this.lastStart = -Infinity;
      this.lastEnd = -Infinity;
      this.lastWorkMs = 0;
    }

    /**
     * The earliest time (same clock as `now`) a pass may start. `live`: only the stream asked for
     * it (no change of the reader's since the last pass).
     */
    due(now, live) {
      let t = Math.max(now, this.lastStart + this.minGapMs);
      if (live) t = Math.max(t, this.lastEnd + this.streamLoad * this.lastWorkMs);
      return t;
    }

    started(now) {
      this.lastStart = now;
    }

    /** A pass ended at `now` after `workMs` of script time (its slices together). */
    ended(now, workMs) {
      this.lastEnd = now;
      this.lastWorkMs = Math.max(0, workMs);
    }

    /**
     * Whether a slice that began at `sliceStart` and drew at least one chart stops at `now`
     * (`live`: of a pass only the stream asked for; the reader's passes are not sliced by time).
     * `viewportDrawn`: the charts in the viewport are drawn and others are still queued; every pass
     * stops there, so the browser paints what is seen before the charts near it are drawn.
     */
    sliceDone(sliceStart, now, live, viewportDrawn) {
      return !!viewportDrawn || (live && now - sliceStart >= this.sliceMs);
    }
  }

  /** Whether an item {top, bottom} (px, relative to the viewport) overlaps the viewport [0, viewHeight). */
  function inViewport(it, viewHeight) {
    return it.top < viewHeight && it.bottom > 0;
  }

  /**
   * The order a pass draws its charts in: those overlapping the viewport [0, viewHeight) first,
   * then the others near it, each group top to bottom. `items`: [{top, bottom, ...}] (px, relative
   * to the viewport). Returns a new array.
   */
  function passOrder(items, viewHeight) {
    const inView = (it) => inViewport(it, viewHeight);
    const byTop = (a, b) => a.top - b.top;
    return items.filter(inView).sort(byTop).concat(items.filter((it) => !inView(it)).sort(byTop));
  }

  return { RedrawPacer, passOrder, inViewport, REDRAW: { MIN_GAP_MS, STREAM_LOAD, SLICE_MS } };
});
