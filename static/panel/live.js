// The panel's one WebSocket (DESIGN §7): a snapshot on connect, then the router's events with
// their seq. An event that is not the next seq means some were lost (channel layers drop
// messages for slow readers): the page applies it anyway, so it stays fast, and asks for a new
// snapshot, which is the truth. Events that arrive while a snapshot is on its way are kept and
// re-applied on top of it. The socket reconnects with exponential back-off (0.5 s … 30 s),
// except when the server closed it because its user has too many tabs open (TOO_MANY, README
// "Configuration"): the page shows the server's reason and waits for a click on it to try again.
// With several hosts each node's router counts its own seq: an event names its node, and the
// merged snapshot gives each node's seq (`seqs`).
(function () {
  "use strict";

  const RECENT = 600; // events kept to re-apply on top of a snapshot
  // The router's event names, from its one catalogue (routerpanel/router/catalogue.py), rendered
  // into every page: no script spells an event name itself.
  const EVENTS = Object.freeze(JSON.parse(document.getElementById("event-names").textContent));
  // And the state sets (routerpanel/router/states.py): RUNNING counts toward models_max (stuck
  // included), STOPPABLE may be unloaded, DOWN has no child.
  const STATES = Object.freeze(
    Object.fromEntries(
      Object.entries(JSON.parse(document.getElementById("model-states").textContent)).map(
        ([name, states]) => [name, new Set(states)],
      ),
    ),
  );
  const MAX_DELAY = 30000;
  const TOO_MANY = 4429; // models_app/dashboard_sockets.py CLOSE_TOO_MANY

  class Live {
    constructor(path, handlers) {
      this.path = path;
      this.handlers = handlers;
      this.seqs = null; // node -> seq of its last event applied; null until a snapshot arrives
      this.recent = [];
      this.attempt = 0;
      this.connects = 0;
      this.snapshots = 0;
      this.awaitingSince = 0;
      this.stale = 0;
      this.nextId = 1;
      this.pending = new Map(); // action id -> resolve
      this.status = document.getElementById("conn");
    }

    start() {
      this.connect();
      window.addEventListener("online", () => this.refused || this.connectSoon(0));
    }

    connect() {
      clearTimeout(this.timer);
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const ws = new WebSocket(`${scheme}://${location.host}${this.path}`);
      this.ws = ws;
      this.setStatus("connecting", "◌ connecting…");
      ws.onopen = () => {
        this.attempt = 0;
        this.connects += 1;
        this.seqs = null;
        this.recent = [];
        this.awaitingSince = Date.now(); // the server sends a snapshot unasked
        this.setStatus("live", "● live");
        this.call("open");
      };
      ws.onmessage = (e) => this.dispatch(JSON.parse(e.data));
      ws.onclose = (e) => {
        if (this.ws !== ws) return;
        for (const resolve of this.pending.values()) resolve({ ok: false, message: "connection lost" });
        this.pending.clear();
        this.call("close");
        if (e.code === TOO_MANY) this.refuse(e.reason || "too many dashboard tabs open: close one");
        else this.connectSoon();
      };
      ws.onerror = () => {}; // onclose follows and reconnects
    }

    connectSoon(delay) {
      if (delay === undefined) {
        const base = Math.min(MAX_DELAY, 500 * 2 ** this.attempt);
        delay = Math.round(base * (0.8 + Math.random() * 0.4));
        this.attempt += 1;
      }
      this.setStatus("reconnecting", `↻ reconnecting in ${Math.ceil(delay / 1000)} s`);
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.connect(), delay);
    }

    refuse(reason) {
      // No reconnecting: every try would be refused until one of the user's tabs closes.
      this.refused = true;
      clearTimeout(this.timer);
      this.setStatus("refused", `✕ ${reason}`);
      if (this.status) {
        this.status.title = "click to try again";
        this.status.onclick = () => {
          this.refused = false;
          this.status.onclick = null;
          this.status.title = "";
          this.connect();
        };
      }
    }

    setStatus(state, text) {
      document.body.dataset.connection = state;
      if (this.status) {
        this.status.hidden = false;
        this.status.textContent = text;
        this.status.className = `conn conn-${state}`;
      }
    }

    isOpen() {
      return this.ws && this.ws.readyState === WebSocket.OPEN;
    }

    send(message) {
      if (!this.isOpen()) return false;
      this.ws.send(JSON.stringify(message));
      return true;
    }

    call(name, ...args) {
      const handler = this.handlers[name];
      if (handler) handler(...args);
    }

    dispatch(message) {
      switch (message.type) {
        case "snapshot":
          return this.onSnapshot(message);
        case "event":
          return this.onEvent(message.event);
        case "action_result": {
          const resolve = this.pending.get(message.id);
          this.pending.delete(message.id);
          if (resolve) resolve(message);
          return undefined;
        }
        default:
          return this.call(message.type, message);
      }
    }

    onSnapshot(message) {
      this.awaitingSince = 0;
      if (!message.snapshot) {
        this.seqs = null;
        this.call("routerDown", message.error || "router unavailable", message.presets || {});
        return;
      }
      const snap = message.snapshot;
      this.snapshots += 1;
      this.call("snapshot", snap, message.presets || {});
      const seqs = Object.assign({}, snap.seqs || { "": snap.seq });
      for (const event of this.recent) {
        const node = event.node || "";
        if (!(node in seqs) || event.seq > seqs[node]) {
          this.call("event", event, true);
          seqs[node] = event.seq;
        }
      }
      this.seqs = seqs;
      this.stale = 0;
    }

    onEvent(event) {
      if (event.type === EVENTS.ROUTER_STARTED) this.recent = []; // a new router counts from 1
      this.recent.push(event);
      if (this.recent.length > RECENT) this.recent.splice(0, this.recent.length - RECENT);
      if (this.seqs === null) {
        this.resync(); // no snapshot yet: the event waits in `recent` for one
        return;
      }
      const node = event.node || "";
      const last = this.seqs[node];
      if (last === undefined || event.seq === last + 1) {
        this.seqs[node] = event.seq; // undefined: a node that joined after the snapshot
        this.stale = 0;
        this.call("event", event, false);
        return;
      }
      if (event.seq <= last) {
        // Old news, or a router that restarted and counts from 1 again.
        this.stale += 1;
        if (event.type === EVENTS.ROUTER_STARTED || this.stale >= 3) {
          this.seqs = null;
          this.resync(true);
        }
        return;
      }
      this.seqs[node] = event.seq; // a gap: show what we have now, then fetch the truth
      this.call("event", event, false);
      this.resync(true);
    }

    resync(force) {
      const waiting = this.awaitingSince && Date.now() - this.awaitingSince < 5000;
      if (waiting && !force) return;
      if (this.send({ type: "resync" })) this.awaitingSince = Date.now();
    }

    action(action, model, extra) {
      const id = this.nextId++;
      return new Promise((resolve) => {
        if (!this.send(Object.assign({ type: "action", id, action, model }, extra || {}))) {
          resolve({ ok: false, message: "not connected" });
          return;
        }
        this.pending.set(id, resolve);
      });
    }
  }

  // ---- small shared helpers -------------------------------------------------------------------

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

  function bytes(value) {
    if (value === null || value === undefined) return "—";
    let size = value;
    let unit = 0;
    while (Math.abs(size) >= 1024 && unit < UNITS.length - 1) {
      size /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${size.toFixed(0)} B` : `${size.toFixed(1)} ${UNITS[unit]}`;
  }

  function seconds(value) {
    if (value === null || value === undefined) return "—";
    if (value < 10) return `${value.toFixed(1)} s`;
    let s = Math.floor(value);
    if (s < 60) return `${s} s`;
    let m = Math.floor(s / 60);
    s %= 60;
    if (m < 60) return `${m} min ${s} s`;
    const h = Math.floor(m / 60);
    m %= 60;
    return `${h} h ${m} min`;
  }

  function ago(epoch) {
    if (!epoch) return "never";
    return `${seconds(Math.max(0, Date.now() / 1000 - epoch))} ago`;
  }

  function clock(epoch) {
    const d = new Date(epoch * 1000);
    return d.toTimeString().slice(0, 8);
  }

  function toast(text, kind) {
    const box = document.getElementById("toasts");
    if (!box) return;
    const item = document.createElement("div");
    item.className = `toast toast-${kind || "info"}`;
    item.textContent = text;
    box.appendChild(item);
    setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
  }

  window.Panel = { Live, EVENTS, STATES, bytes, seconds, ago, clock, toast };
})();
