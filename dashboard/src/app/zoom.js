/* Linked zoom of the chart board: every chart has the same x extent, so one window in x units fits
 * all. Done by hand rather than echarts.connect, which would also pop up every chart's tooltip at
 * once. Browser only. */
(function (root) {
  "use strict";
  const ZOOM_SETTLE_MS = 350;

  class LinkedZoom {
    /**
     * board: {panels: Map<id, ChartCard>, extent: {min, max} | null}. settled(zoom): a gesture
     * settled on `zoom` ({startValue, endValue} in x units, null = everything).
     */
    constructor(board, settled) {
      this.board = board;
      this.settled = settled;
      this.timer = null;
      this.zoom = null; // the settled zoom window; null = everything
      this.win = null; // the window being shown (follows a gesture before it settles)
      this.syncing = false;
    }

    /** A chart's own dataZoom event (a drag, the slider, the wheel): the other charts follow. */
    onChartZoom(source, ev) {
      if (this.syncing) return;
      const p = ev && ev.batch ? ev.batch[0] : ev || {};
      let a = p.startValue;
      let b = p.endValue;
      const ext = this.board.extent;
      if ((a === undefined || b === undefined) && ext && ext.min !== null) {
        const dz = source.chart.getOption().dataZoom[0];
        a = dz.startValue;
        b = dz.endValue;
      }
      if (!Number.isFinite(a) || !Number.isFinite(b)) return;
      this._set(a, b, source);
    }

    /** Show window `win` (null: everything) on one chart, without echoing its event back. */
    show(card, win) {
      if (!card.interactive) return; // no zoom on it yet: shown when it gets it (ChartBoard._interact)
      this.syncing = true;
      try {
        if (win) card.chart.dispatchAction({ type: "dataZoom", startValue: win.startValue, endValue: win.endValue });
        else card.chart.dispatchAction({ type: "dataZoom", start: 0, end: 100 });
      } finally {
        this.syncing = false;
      }
    }

    _set(a, b, source) {
      const ext = this.board.extent;
      const full = !ext || ext.min === null || (a <= ext.min + 1e-9 * Math.abs(ext.min || 1) && b >= ext.max - 1e-9 * Math.abs(ext.max || 1));
      this.win = full ? null : { startValue: a, endValue: b };
      for (const c of this.board.panels.values()) if (c !== source && c.chart) this.show(c, this.win);
      clearTimeout(this.timer);
      // Refetch only when the user stops zooming: one request per gesture, not per wheel tick.
      this.timer = setTimeout(() => {
        this.zoom = this.win;
        this.settled(this.zoom);
      }, ZOOM_SETTLE_MS);
    }

    /** Zoom every chart to [a, b] in x units. */
    zoomTo(a, b) {
      if (!(b > a)) return;
      this._set(a, b, null);
    }

    reset() {
      this._set(-Infinity, Infinity, null);
    }

    /** Current x-axis zoom window of the first chart: {start, end} in percent, {startValue, endValue} in x units. */
    current() {
      const first = Array.from(this.board.panels.values()).find((c) => c.chart && c.interactive);
      if (!first) return null;
      const dz = first.chart.getOption().dataZoom[0];
      return { start: dz.start, end: dz.end, startValue: dz.startValue, endValue: dz.endValue };
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.LinkedZoom = LinkedZoom;
})(self);
