/* The chart board's redraw loop: redraws asked for are coalesced into passes, started when
 * lib/pacer.js allows, and each pass draws its charts a slice per animation frame. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;

  class RedrawLoop {
    /**
     * hooks: {holdMs() -> ms the app holds drawing (the runs shown at opening still arriving),
     * begin() -> {queue: [card], inView, inputs} (lay out, and the charts to draw in order, the first
     * `inView` of them in the viewport: drawn in a slice of their own), inputs() -> what a
     * chart is drawn from now, wanted(card) -> whether a queued chart is still to be drawn,
     * drawCard(card, inputs, inView) (`inView`: one of the pass's charts in the viewport),
     * ended(live) (a pass finished)}.
     */
    constructor(hooks) {
      this.hooks = hooks;
      this.dirty = false;
      this.live = true; // only the stream asked for the pending redraw (see lib/pacer.js)
      this.timer = 0;
      this.timerDue = 0;
      this.pass = null; // the pass under way: {queue: [card], live, workMs, raf}
      this.pacer = new L.RedrawPacer();
      this.passes = 0;
    }

    /** Truthy while a pass is scheduled or under way (`!dirty && !busy`: everything asked for is drawn). */
    get busy() {
      return this.timer || (this.pass ? 1 : 0);
    }

    /**
     * Ask for a redraw (`live`: only streamed records changed the data, a redraw that may wait
     * longer). While the app holds drawing, the pass waits that long: one draw with every run
     * instead of one per run.
     */
    request(live) {
      this.dirty = true;
      if (!live) this.live = false;
      if (!this.pass) this._schedule();
    }

    _schedule() {
      const now = performance.now();
      const hold = this.hooks.holdMs();
      const due = Math.max(now + hold, this.pacer.due(now, this.live));
      if (this.timer) {
        if (due >= this.timerDue - 1) return;
        clearTimeout(this.timer); // the hold ended early (the last run arrived), or the reader acted: draw sooner
      }
      this.timerDue = due;
      this.timer = setTimeout(() => {
        requestAnimationFrame(() => {
          this.timer = 0;
          if (!this.dirty || this.pass) return; // (a pass under way schedules the next when it ends)
          if (this.hooks.holdMs() > 0) this._schedule();
          else this._begin();
        });
      }, due - now);
    }

    /** Start a pass: the hooks lay out and name the charts to draw; the first slice is drawn now. */
    _begin() {
      const live = this.live;
      this.dirty = false;
      this.live = true;
      this.passes++;
      const now = performance.now();
      this.pacer.started(now);
      const { queue, inputs, inView } = this.hooks.begin();
      this.pass = { queue, live, inView: inView || 0, taken: 0, workMs: performance.now() - now, raf: 0 };
      this._slice(inputs);
    }

    /** Draw the next charts of the pass (at least one): for a streaming pass, about the pacer's slice of script time. */
    _slice(inputs) {
      const pass = this.pass;
      const t0 = performance.now();
      const current = inputs || this.hooks.inputs(); // the data may have grown since the pass began
      while (pass.queue.length) {
        const card = pass.queue.shift();
        pass.taken++;
        // (the last chart in the viewport, even one gone meanwhile, ends the slice when more follow)
        const viewportDrawn = pass.taken === pass.inView && pass.queue.length > 0;
        if (!this.hooks.wanted(card)) {
          if (viewportDrawn) break;
          continue; // gone or scrolled away meanwhile
        }
        this.hooks.drawCard(card, current, pass.taken <= pass.inView);
        if (this.pacer.sliceDone(t0, performance.now(), pass.live, viewportDrawn)) break;
      }
      pass.workMs += performance.now() - t0;
      if (pass.queue.length) {
        pass.raf = requestAnimationFrame(() => this._slice(null));
        return;
      }
      this.pass = null;
      this.pacer.ended(performance.now(), pass.workMs);
      this.hooks.ended(pass.live);
      if (this.dirty) this._schedule();
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.RedrawLoop = RedrawLoop;
})(self);
