/* HTTP + WebSocket client of `gradmon serve` (docs/protocol.md). Browser only. */
(function (root) {
  "use strict";

  const L = root.GradmonLib;

  class Client {
    /**
     * token: the page URL's ?token= (sent on every request and on the WebSocket URL), or null.
     * onMessage(msg): each parsed server message; onState(state): "connecting" | "connected" | "reconnecting".
     */
    constructor(options) {
      this.token = options.token || null;
      this.onMessage = options.onMessage;
      this.onState = options.onState || (() => {});
      this.ws = null;
      this.attempt = 0;
      this.timer = null;
      this.closed = false;
      this.state = "connecting";
    }

    url(path, params) {
      return L.apiUrl(location.href, path, params, this.token);
    }

    getJson(path, params) {
      return this.bodyOf(fetch(this.url(path, params), { cache: "no-store" }));
    }

    /** The JSON body of a fetch() under way (getJson's; boot/early.js hands over answers read already: answerOf); an error status throws. */
    async bodyOf(pending) {
      const resp = await pending;
      let body = null;
      try {
        body = await resp.json();
      } catch (e) {
        body = null;
      }
      return this.answerOf({ ok: resp.ok, status: resp.status, body });
    }

    /** The body of an answer read already ({ok, status, body}, or a promise of it: boot/early.js's); an error status throws. */
    async answerOf(pending) {
      const { ok, status, body } = await pending;
      if (!ok) {
        const err = new Error((body && body.error) || "HTTP " + status);
        err.status = status;
        throw err;
      }
      return body;
    }

    runs() {
      return this.getJson("/api/runs");
    }

    /** GET history: {points, start, end} all optional. */
    history(name, params) {
      return this.getJson(L.runPath(name, "/history"), params);
    }

    connect() {
      this.closed = false;
      this._setState(this.attempt ? "reconnecting" : "connecting");
      const u = new URL(this.url("/ws"));
      u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
      let ws;
      try {
        ws = new WebSocket(u.toString());
      } catch (e) {
        this._retry();
        return;
      }
      this.ws = ws;
      ws.onopen = () => {
        this.attempt = 0;
        this._setState("connected");
      };
      ws.onmessage = (ev) => {
        let msg;
        try {
          msg = JSON.parse(ev.data);
        } catch (e) {
          console.warn("gradmon: ignoring a message that is not JSON");
          return;
        }
        this.onMessage(msg);
      };
      ws.onclose = () => {
        if (this.ws === ws) this.ws = null;
        if (!this.closed) this._retry();
      };
      ws.onerror = () => {}; // onclose follows and schedules the reconnect
    }

    _retry() {
      this.attempt++;
      this._setState("reconnecting");
      // Exponential backoff with jitter: 0.5 s, 1 s, 2 s, ... capped at 10 s.
      const delay = Math.min(10000, 500 * Math.pow(2, this.attempt - 1)) * (0.8 + 0.4 * Math.random());
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.connect(), delay);
    }

    _setState(s) {
      if (s === this.state) return;
      this.state = s;
      this.onState(s);
    }

    /** Send a message when connected; returns false (and drops it) otherwise: hello triggers a resend. */
    send(msg) {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
      this.ws.send(JSON.stringify(msg));
      return true;
    }

    close() {
      this.closed = true;
      clearTimeout(this.timer);
      if (this.ws) this.ws.close();
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.Client = Client;
})(self);
