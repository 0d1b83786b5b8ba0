/* The alarm banner (one line per incident, grouped by run), opt-in browser notifications, and the
 * log notes (I/O errors, history overflow: not alarms). Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  const el = A.el;
  const MAX_LINES_PER_RUN = 20;
  const NOTE_KINDS = new Set(["io_error", "history_overflow"]);
  const OPT_IN_KEY = "gradmon-notifications";

  class AlarmBanner {
    /**
     * box: the banner element; notes: the notes element; button: the notifications toggle.
     * app: {entries() -> [{run, color}], zoomToSteps(run, a, b), multiRun(), showAlarm(incident)}.
     */
    constructor(box, notes, button, app) {
      this.box = box;
      this.notesBox = notes;
      this.button = button;
      this.app = app;
      this.seen = new Set(); // incident keys already known (notified or present at load)
      this.sent = []; // notifications sent: {title, body, key} (for tests and the curious)
      this.primed = new Set(); // runs whose existing incidents were taken as known
      this.enabled = false;
      this._initButton();
    }

    _initButton() {
      const supported = typeof root.Notification === "function";
      if (!supported) {
        this.button.hidden = true;
        return;
      }
      let wanted = false;
      try {
        wanted = root.localStorage.getItem(OPT_IN_KEY) === "on";
      } catch (e) {
        wanted = false;
      }
      this.enabled = wanted && root.Notification.permission === "granted";
      this._renderButton();
      // Asked only on a click: browsers (rightly) ignore permission prompts nobody asked for.
      this.button.addEventListener("click", async () => {
        if (this.enabled) {
          this._setEnabled(false);
          return;
        }
        let perm = root.Notification.permission;
        if (perm === "default") perm = await root.Notification.requestPermission();
        this._setEnabled(perm === "granted");
        if (perm === "denied") this.button.title = "Notifications are blocked for this page in the browser's settings";
      });
    }

    _setEnabled(on) {
      this.enabled = on;
      try {
        root.localStorage.setItem(OPT_IN_KEY, on ? "on" : "off");
      } catch (e) {
        // storage unavailable (file://, private mode): the choice lasts this page only
      }
      this._renderButton();
    }

    _renderButton() {
      this.button.textContent = this.enabled ? "alerts: on" : "alerts: off";
      this.button.setAttribute("aria-pressed", this.enabled ? "true" : "false");
      this.button.title = this.enabled
        ? "Browser notifications for new alarms and aborts are on (click to turn off)"
        : "Get a browser notification for each new alarm or abort, even when this tab is in the background";
    }

    /** Every shown run's incidents, newest run first as the entries go. */
    incidents() {
      const out = [];
      for (const { run, color } of this.app.entries()) {
        for (const inc of L.incidentsOf(run.name, run.alarmEvents)) out.push(Object.assign(inc, { color }));
      }
      return out;
    }

    /**
     * Redraw when the incidents changed, and notify new ones. `loadedRuns`: names whose history has
     * arrived; their incidents at that moment are known, not news.
     */
    render(loadedRuns) {
      const incs = this.incidents();
      this._notify(incs, loadedRuns);
      const key = incs.map((i) => i.key + ":" + i.end + ":" + i.ongoing + ":" + i.flagged).join(",") + (this.app.multiRun() ? "|m" : "");
      if (this.box.dataset.key !== key) {
        this.box.dataset.key = key;
        this._draw(incs);
      }
      this._notes();
    }

    _draw(incs) {
      this.box.textContent = "";
      this.box.hidden = incs.length === 0;
      if (!incs.length) return;
      const runs = new Set(incs.map((i) => i.run));
      const ongoing = incs.filter((i) => i.ongoing).length;
      let title = "⚠ " + incs.length + (incs.length === 1 ? " alarm" : " alarms");
      if (runs.size > 1) title += " in " + runs.size + " runs";
      if (ongoing) title += " · " + ongoing + " ongoing";
      this.box.appendChild(el("strong", "banner-title", title));
      const byRun = new Map();
      for (const inc of incs) {
        if (!byRun.has(inc.run)) byRun.set(inc.run, []);
        byRun.get(inc.run).push(inc);
      }
      for (const [name, list] of byRun) {
        const group = el("div", "banner-run");
        group.dataset.run = name;
        const head = el("span", "banner-run-name", name);
        head.style.borderLeftColor = list[0].color;
        group.appendChild(head);
        const shown = list.slice(-MAX_LINES_PER_RUN);
        if (list.length > shown.length) group.appendChild(el("span", "more", "+" + (list.length - shown.length) + " earlier"));
        for (const inc of shown) group.appendChild(this._line(inc));
        this.box.appendChild(group);
      }
    }

    _line(inc) {
      const b = el("button", "incident incident-" + inc.reason + (inc.ongoing ? " ongoing" : ""));
      b.type = "button";
      b.dataset.run = inc.run;
      b.dataset.start = inc.start;
      b.dataset.end = inc.end;
      b.dataset.reason = inc.reason;
      b.textContent = L.incidentText(inc, L.formatValue);
      const summary = L.forensicsSummary(inc.alarm); // which layer / rank, when the writer kept forensics
      if (summary) b.appendChild(el("span", "incident-forensics", " · " + summary));
      b.title = [inc.message, inc.endMessage].filter(Boolean).join("\n") + (inc.message ? "\n" : "") + "Click to zoom to it and see its details";
      b.style.borderLeftColor = inc.color;
      b.addEventListener("click", () => {
        this.app.zoomToSteps(inc.run, inc.start, inc.end);
        if (this.app.showAlarm) this.app.showAlarm(inc);
      });
      return b;
    }

    _notify(incs, loadedRuns) {
      const fresh = [];
      for (const name of loadedRuns) {
        if (this.primed.has(name)) continue;
        this.primed.add(name);
        for (const inc of incs) if (inc.run === name) this.seen.add(inc.key); // already there when the page opened
      }
      for (const inc of incs) if (this.primed.has(inc.run) && !this.seen.has(inc.key)) fresh.push(inc);
      for (const inc of fresh) {
        this.seen.add(inc.key);
        if (!this.enabled) continue;
        const title = "gradmon · " + inc.run + ": " + L.reasonTitle(inc.reason);
        const body = L.incidentText(inc, L.formatValue) + (inc.message ? "\n" + inc.message : "");
        try {
          const n = new root.Notification(title, { body, tag: inc.key });
          n.onclick = () => {
            root.focus();
            this.app.zoomToSteps(inc.run, inc.start, inc.end);
          };
          this.sent.push({ title, body, key: inc.key });
        } catch (e) {
          console.warn("gradmon: notification failed:", e.message);
        }
      }
    }

    /** I/O errors and history overflows of the shown runs: a muted line, not alarms. */
    _notes() {
      const notes = [];
      for (const { run } of this.app.entries()) {
        for (const ev of run.events) {
          if (!NOTE_KINDS.has(ev.kind)) continue;
          const what = ev.kind === "io_error" ? (ev.dropped || "some") + " records lost to I/O errors" : (ev.count || "some") + " steps lost (device history ring overflow)";
          notes.push(run.name + ": " + what + (typeof ev.step === "number" ? " at step " + ev.step : ""));
        }
      }
      const text = notes.length ? "Log notes: " + notes.slice(-5).join(" · ") + (notes.length > 5 ? " · +" + (notes.length - 5) + " more" : "") : "";
      if (this.notesBox.textContent !== text) this.notesBox.textContent = text;
      this.notesBox.hidden = !text;
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.AlarmBanner = AlarmBanner;
})(self);
