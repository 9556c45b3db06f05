// The dashboard's live parts: model cards, the queue, the memory chart and the audit feed.
// State comes from the snapshot and is kept current by the events (see live.js); each event
// updates the DOM at once, and a snapshot shortly after fills in what events do not carry (the
// port, the child's info).
(function () {
  "use strict";

  const { Live, EVENTS, STATES, bytes, seconds, ago, clock, toast } = window.Panel;
  const root = document.getElementById("dashboard");
  if (!root) return;

  const ICONS = {
    loaded: "●", loading: "◐", sleeping: "☾", unloaded: "○", failed: "✕",
    quarantined: "⊘", stuck: "⚠", unknown: "?",
  };
  const DOWN = new Set([...STATES.DOWN, "unknown"]); // "unknown": the page has not heard yet
  const { RUNNING, STOPPABLE } = STATES;
  const FEED_ROWS = 12;
  const MAX_POINTS = 3600;
  const MIN_SPAN = 120; // seconds the live memory charts span at least

  const canOperate = root.dataset.canOperate === "1";
  const models = new Map(); // name -> snapshot row (kept current by events)
  const since = new Map(); // name -> [state key, wall time it entered it]
  const QUEUE_SHOWN = 5; // requests listed under each queue entry (as the server renders it)
  let presets = {};
  let queue = [];
  let config = {};
  let refreshTimer = null;

  // ---- cards ------------------------------------------------------------------------------------

  function card(name) {
    let el = root.querySelector(`.model-card[data-model="${CSS.escape(name)}"]`);
    if (el) return el;
    const template = document.getElementById("card-template");
    el = template.content.firstElementChild.cloneNode(true);
    el.dataset.model = name;
    field(el, "name").textContent = name;
    const logs = field(el, "logs-link");
    logs.href = root.dataset.logsUrl.replace("MODEL", encodeURIComponent(name).replace(/%2F/g, "/"));
    logs.setAttribute("aria-label", `Logs of ${name}`);
    const input = field(el, "model-input");
    if (input) input.value = name;
    bindActions(el);
    const empty = document.getElementById("no-models");
    if (empty) empty.remove();
    document.getElementById("cards").appendChild(el);
    return el;
  }

  function field(el, name) {
    return el.querySelector(`[data-field="${name}"]`);
  }

  function setText(el, name, text) {
    const node = field(el, name);
    if (node && node.textContent !== text) node.textContent = text;
  }

  function show(el, name, visible) {
    const node = field(el, name);
    if (node) node.hidden = !visible;
  }

  function render(m) {
    const el = card(m.name);
    const state = m.state || "unknown";
    el.className = `model-card state-${state}${m.stopping ? " is-stopping" : ""}`;
    el.dataset.state = state;
    el.dataset.stopping = m.stopping ? "1" : "0";
    setText(el, "icon", ICONS[state] || "?");
    setText(el, "state-text", state);
    show(el, "stopping", !!m.stopping);
    show(el, "pinned", !!m.pinned);
    show(el, "node", !!(m.node || m.lost_on));
    setText(el, "node-name", m.node || (m.lost_on ? `${m.lost_on}, lost` : ""));
    field(el, "node").classList.toggle("is-lost", !m.node && !!m.lost_on);
    cardReason(el, m.name);
    renderProgress(el, m);
    const estimate = (presets[m.name] || {}).estimate;
    const mem = field(el, "memory");
    mem.textContent = bytes(m.memory);
    if (estimate) {
      const small = document.createElement("small");
      small.textContent = ` est. ${bytes(estimate)}`;
      mem.appendChild(small);
    }
    setText(el, "in_flight", String(m.in_flight || 0));
    setText(el, "holders", holdersText(m.holders));
    setText(el, "pid", m.pid ? String(m.pid) : "—");
    setText(el, "port", m.port ? String(m.port) : "—");
    field(el, "last_used").dataset.epoch = m.last_used || "";
    setText(el, "stop_timeout", m.stop_timeout === null || m.stop_timeout === undefined ? "—" : `${Math.round(m.stop_timeout)} s`);
    setText(el, "last_exit", exitText(m.last_exit));
    renderBackoff(el, m);
    renderCannotStart(el, m);
    const line = field(el, "lastline");
    line.hidden = !(m.note || (state === "loading" && m.lastline));
    line.textContent = m.note || m.lastline || "";
    const preset = presets[m.name];
    const link = field(el, "preset-link");
    if (link && preset) {
      link.href = root.dataset.presetUrl.replace("/0/", `/${preset.id}/`);
      link.hidden = false;
    }
    for (const button of el.querySelectorAll("button[data-show]")) {
      const rule = button.dataset.show;
      button.hidden = !(
        (rule === "down" && DOWN.has(state)) ||
        (rule === "running" && STOPPABLE.has(state) && !m.stopping) ||
        (rule === "pinned" && m.pinned) ||
        (rule === "unpinned" && !m.pinned)
      );
    }
    tickCard(el, m);
    scheduleReasons();
  }

  let reasonsPending = false;
  function scheduleReasons() {
    if (reasonsPending) return;
    reasonsPending = true;
    queueMicrotask(() => {
      reasonsPending = false;
      refreshReasons();
    });
  }

  // Who has requests in flight: "user:alice ×2, key:bob/ci".
  function holdersText(holders) {
    return Object.entries(holders || {})
      .map(([actor, n]) => (n > 1 ? `${actor} ×${n}` : actor))
      .join(", ");
  }

  function renderProgress(el, m) {
    const box = field(el, "progress");
    box.hidden = m.state !== "loading";
    const bar = field(el, "progress-bar");
    const value = m.progress && typeof m.progress.value === "number" ? m.progress.value : null;
    if (value === null) {
      bar.removeAttribute("value");
      setText(el, "progress-text", "loading…");
    } else {
      bar.value = Math.round(value * 100);
      setText(el, "progress-text", `${Math.round(value * 100)}%`);
    }
  }

  // A model whose program or files are missing is refused before anyone is evicted for it.
  function renderCannotStart(el, m) {
    const down = !["loading", "loaded", "sleeping"].includes(m.state);
    show(el, "cannot_start", !!(m.cannot_start && down));
    if (m.cannot_start) setText(el, "cannot_start", `Cannot start: ${m.cannot_start}`);
  }

  // A crash loop holds the next start back: say why and count down (backoff.until is wall time).
  function renderBackoff(el, m) {
    const b = m.backoff;
    const left = b ? b.until - Date.now() / 1000 : 0;
    show(el, "backoff", left > 0);
    if (left > 0) {
      const times = b.strikes === 1 ? "once" : `${b.strikes}× in a row`;
      setText(el, "backoff", `Held back after a crash loop: died soon after start ${times} ` +
        `(last: ${b.reason}); next start in ${seconds(left)} — Load starts it now`);
    }
  }

  function exitText(exit) {
    if (!exit) return "—";
    const parts = [exit.clean ? "clean" : "unexpected"];
    parts.push(`code ${exit.exit_code === null || exit.exit_code === undefined ? "—" : exit.exit_code}`);
    if (exit.signal) parts.push(`signal ${exit.signal}`);
    if (exit.force_killed) parts.push("force-killed");
    if (exit.error) parts.push(exit.error);
    return parts.join(", ");
  }

  function stateKey(state, stopping) {
    return `${state}${stopping ? "+stopping" : ""}`;
  }

  function tickCard(el, m) {
    const entered = since.get(m.name);
    const current = entered && entered[0] === stateKey(m.state, m.stopping);
    const text = current ? `for ${seconds(Math.max(0, Date.now() / 1000 - entered[1]))}` : "";
    setText(el, "since", text);
    const used = field(el, "last_used");
    setText(el, "last_used", ago(Number(used.dataset.epoch) || null));
    renderBackoff(el, m);
  }

  function markSince(name, state, time) {
    const entered = since.get(name);
    if (!entered || entered[0] !== state) since.set(name, [state, time]);
  }

  // ---- snapshot and events ----------------------------------------------------------------------

  function applySnapshot(snap, presetFacts) {
    presets = presetFacts;
    config = snap.config || {};
    document.getElementById("router-banner").hidden = true;
    const seen = new Set();
    for (const row of snap.models) {
      const old = models.get(row.name) || {};
      const m = Object.assign({}, row, { note: keptNote(old, row), noteAt: old.noteAt, lastline: old.lastline });
      models.set(row.name, m);
      seen.add(row.name);
      if (row.state_since) since.set(row.name, [stateKey(row.state, row.stopping), row.state_since]);
      render(m);
    }
    for (const [name] of models) {
      if (!seen.has(name)) {
        models.delete(name);
        const el = root.querySelector(`.model-card[data-model="${CSS.escape(name)}"]`);
        if (el) el.remove();
      }
    }
    queue = snap.queue || [];
    renderQueue();
    renderNodes(snap.nodes || []);
    // Several hosts: the slots of every live node together (0 when one has no limit).
    const live = (snap.nodes || []).filter((n) => n.state === "live");
    const max = live.length ? (live.some((n) => !n.models_max) ? 0 : live.reduce((t, n) => t + n.models_max, 0)) : config.models_max;
    const running = snap.models.filter((m) => RUNNING.has(m.state)).length;
    document.getElementById("slots").textContent =
      max === undefined ? "" : `${running} of ${max === 0 ? "unlimited" : max} running`;
    if (snap.memory) renderMemNow(snap.memory);
  }

  // A note says why a model went down (evicted, killed as hung, stuck). A snapshot drops it only
  // when the model has come up again since: a snapshot asked for before the eviction and answered
  // after it still shows the model loaded, from before the note.
  function keptNote(old, row) {
    if (!old.note) return null;
    const upSince = !DOWN.has(row.state) && row.state_since && old.noteAt && row.state_since > old.noteAt;
    return upSince ? null : old.note;
  }

  // Several hosts (issue 18): each node's health in the header, and the cards grouped by the
  // node their model runs on (models that run nowhere last), under a heading per node.
  function renderNodes(nodes) {
    const list = document.getElementById("nodes");
    list.hidden = !nodes.length;
    list.replaceChildren();
    for (const n of nodes) {
      const li = document.createElement("li");
      li.className = `node node-${n.state}`;
      li.dataset.node = n.node;
      const name = document.createElement("strong");
      name.textContent = n.node;
      const state = document.createElement("span");
      state.dataset.field = "node-state";
      state.textContent = n.state === "live" ? "● live" : `✕ lost${n.beat_age ? ` ${seconds(n.beat_age)} ago` : ""}`;
      const facts = document.createElement("small");
      facts.className = "muted";
      facts.dataset.field = "node-facts";
      const max = n.models_max ? n.models_max : "∞";
      facts.textContent = `${n.running || 0} of ${max} running` +
        (typeof n.memory_available === "number" ? `, ${bytes(n.memory_available)} free` : "");
      li.append(name, " ", state, " ", facts);
      list.append(li);
    }
    groupCards(nodes);
    renderNodePicker(nodes);
  }

  // The memory charts show one node's machine: a button per node picks which (its last hour
  // from its router; the 24 h and 7 d rollups are the installation's).
  let chartNode = null;
  function renderNodePicker(nodes) {
    const picker = document.getElementById("chart-nodes");
    picker.hidden = nodes.length < 2;
    if (!nodes.length) return;
    if (chartNode === null || !nodes.some((n) => n.node === chartNode)) {
      chartNode = (nodes.find((n) => n.state === "live") || nodes[0]).node;
    }
    picker.replaceChildren();
    for (const n of nodes) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.node = n.node;
      button.textContent = n.node;
      button.setAttribute("aria-pressed", String(n.node === chartNode));
      button.addEventListener("click", () => pickChartNode(n.node));
      picker.append(button);
    }
  }

  async function pickChartNode(node) {
    chartNode = node;
    for (const b of document.querySelectorAll("#chart-nodes button")) b.setAttribute("aria-pressed", String(b.dataset.node === node));
    const url = `${root.dataset.historyUrl}?range=1h&node=${encodeURIComponent(node)}`;
    const response = await fetch(url, { credentials: "same-origin" });
    const data = response.ok ? await response.json() : { available: false };
    if (chartNode !== node) return;
    chart.load(data.available ? data.columns : {});
    if (chart.range !== "1h") chart.showRange(chart.range); // that node's rollups
    document.getElementById("memory-node").textContent = ` of ${node}`;
  }

  function groupCards(nodes) {
    const box = document.getElementById("cards");
    for (const head of box.querySelectorAll(".node-head")) head.remove();
    if (!nodes.length) return;
    const order = new Map(nodes.map((n, i) => [n.node, i]));
    const cards = [...box.querySelectorAll(".model-card")];
    const where = (el) => {
      const m = models.get(el.dataset.model) || {};
      return m.node || m.lost_on || "";
    };
    const rank = (el) => (order.has(where(el)) ? order.get(where(el)) : nodes.length);
    cards.sort((a, b) => rank(a) - rank(b) || a.dataset.model.localeCompare(b.dataset.model));
    let last = null;
    for (const el of cards) {
      const node = where(el);
      if (node !== last) {
        const head = document.createElement("h3");
        head.className = "node-head";
        const n = nodes.find((x) => x.node === node);
        head.textContent = node ? `${node}${n && n.state !== "live" ? " (lost)" : ""}` : "Not running";
        box.append(head);
        last = node;
      }
      box.append(el);
    }
  }

  function routerDown(error) {
    const banner = document.getElementById("router-banner");
    banner.hidden = false;
    banner.querySelector('[data-field="router-error"]').textContent = error;
  }

  function model(name) {
    if (!models.has(name)) models.set(name, { name, state: "unknown" });
    return models.get(name);
  }

  const ON = {
    [EVENTS.MODEL_STATE](d, ev) {
      const m = model(d.model);
      const down = DOWN.has(d.to);
      if (ev.node) {
        // Several hosts: every node knows the preset; its copy going down on one node says
        // nothing about the model running on another.
        if (down && m.node && m.node !== ev.node) return;
        m.node = down ? null : ev.node;
      }
      m.state = d.to;
      m.status = d.status;
      m.stopping = d.stopping;
      if (d.progress !== undefined) m.progress = d.progress;
      if (d.to === "loading" && d.from !== "loading") {
        m.progress = null;
        m.lastline = null;
        m.note = null;
        m.backoff = null;
      }
      if (down) Object.assign(m, { pid: null, port: null, memory: null, in_flight: 0, holders: {} });
      markSince(d.model, stateKey(d.to, d.stopping), ev.time);
      render(m);
      scheduleRefresh();
    },
    [EVENTS.MODEL_PROGRESS](d) {
      const m = model(d.model);
      m.progress = d.progress;
      renderProgress(card(d.model), m);
    },
    [EVENTS.MODEL_EVICTED](d, ev) {
      const m = model(d.victim);
      const trigger = d.trigger || {};
      m.noteAt = ev.time;
      m.note = `Evicted for ${trigger.model || "another model"} by ${trigger.actor || "the scheduler"}` +
        ` after ${seconds(d.idle_for || 0)} idle`;
      render(m);
    },
    [EVENTS.MODEL_EXITED](d) {
      const m = model(d.model);
      m.last_exit = d;
      m.exit_code = d.exit_code;
      render(m);
      scheduleRefresh();
    },
    [EVENTS.MODEL_LOG](d) {
      const m = models.get(d.model);
      if (m && m.state === "loading") {
        m.lastline = d.text;
        const el = card(d.model);
        const line = field(el, "lastline");
        if (!m.note) {
          line.hidden = false;
          line.textContent = d.text;
        }
      }
    },
    [EVENTS.MODEL_HUNG](d, ev) {
      const m = model(d.model);
      const who = holdersText(d.holders) || "nobody";
      const n = d.in_flight || 0;
      m.noteAt = ev.time;
      m.note = `Killed as hung: no progress for ${seconds(d.idle_seconds || 0)} (${d.probe}); ` +
        `${n} request${n === 1 ? "" : "s"} in flight (${who}) answered 503`;
      render(m);
      scheduleRefresh();
    },
    [EVENTS.MODEL_REFUSED](d) {
      const m = model(d.model);
      m.cannot_start = d.reason;
      render(m);
    },
    [EVENTS.MODEL_BACKOFF](d) {
      const m = model(d.model);
      m.backoff = { until: d.until, strikes: d.strikes, reason: d.reason };
      render(m);
    },
    [EVENTS.NODE_CHANGED](d) {
      // A node joined or was lost (several hosts): the header and the cards follow the truth.
      const lost = d.change === "lost";
      toast(lost ? `Node ${d.node} lost: no heartbeat for ${seconds(d.silent_for || 0)}` : `Node ${d.node} joined`, lost ? "error" : "ok");
      scheduleRefresh();
    },
    [EVENTS.MODEL_STUCK](d, ev) {
      const m = model(d.model);
      m.noteAt = ev.time;
      m.note = `Stuck: pid ${d.pid} survived SIGKILL ${seconds(d.seconds_since_kill)} ago`;
      render(m);
      scheduleRefresh();
    },
    [EVENTS.QUEUE_CHANGED](d, ev) {
      // Several hosts: each node sends its own queue; the table shows them all.
      queue = ev.node
        ? queue.filter((e) => e.node !== ev.node).concat(d.entries.map((e) => Object.assign({}, e, { node: ev.node })))
        : d.entries;
      const positions = new Map(queue.map((e) => [e.model, e]));
      for (const m of models.values()) {
        const entry = positions.get(m.name);
        const pos = entry ? entry.position : null;
        if (m.queue_position !== pos) {
          m.queue_position = pos;
          m.queue_waiters = entry ? entry.waiters : 0;
          render(m);
        }
      }
      renderQueue();
    },
    [EVENTS.MEMORY_SAMPLE](d, ev) {
      if (!ev.node || !chartNode || ev.node === chartNode) {
        chart.push(d); // several hosts: the charts show one node's machine at a time
        renderMemNow(d.system);
      }
      const busy = d.in_flight || {};
      for (const m of models.values()) {
        const child = (d.children || {})[m.name];
        const mem = child ? child.rss : null;
        let changed = false;
        if (RUNNING.has(m.state) && child && (m.memory !== mem || m.pid !== child.pid)) {
          m.memory = mem;
          m.pid = child.pid;
          changed = true;
        }
        const now = busy[m.name] || { n: 0, by: {} };
        if (d.in_flight && (now.n !== (m.in_flight || 0) || holdersText(now.by) !== holdersText(m.holders))) {
          m.in_flight = now.n;
          m.holders = now.by;
          changed = true;
        }
        if (changed) render(m);
      }
    },
  };

  function applyEvent(ev) {
    const handler = ON[ev.type];
    if (handler) handler(ev.data || {}, ev);
    else if (ev.type !== EVENTS.MEMORY_SETTLED) scheduleRefresh(); // reloads, settings, restarts
  }

  // Events say what changed; a snapshot soon after fills in what they do not carry (port, the
  // child's info). At most one is pending, so a stream of events cannot starve it.
  function scheduleRefresh() {
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      live.resync(true);
    }, 300);
  }

  // ---- queue ------------------------------------------------------------------------------------

  function renderQueue() {
    const body = document.getElementById("queue-body");
    body.replaceChildren();
    const depth = queue.reduce((n, e) => n + e.waiters, 0);
    document.getElementById("queue-depth").textContent = `${depth} waiting`;
    if (!queue.length) {
      const tr = body.insertRow();
      tr.className = "empty";
      const td = tr.insertCell();
      td.colSpan = 5;
      td.textContent = "Nothing is waiting.";
      return;
    }
    for (const entry of queue) {
      const tr = body.insertRow();
      tr.className = "queue-entry";
      tr.dataset.model = entry.model;
      const cells = [[entry.position, "#"], [entry.model, "Model"], [entry.waiters, "Requests"], ["", "Waiting for"], ["", "Status"]];
      for (const [text, label] of cells) {
        const td = tr.insertCell();
        td.textContent = String(text);
        td.dataset.label = label; // the phone layout stacks the cells under these labels
      }
      if (entry.node) {
        const where = document.createElement("small");
        where.className = "muted node-of";
        where.textContent = ` on ${entry.node}`;
        tr.cells[1].append(where);
      }
      renderWaiters(tr.cells[2], entry);
      const status = document.createElement("span");
      status.className = "queue-status";
      status.dataset.field = "queue-status";
      tr.cells[4].append(status);
      // What it waits on and what would help, under the entry across the table.
      const why = body.insertRow();
      why.className = "queue-why";
      why.dataset.model = entry.model;
      const whyCell = why.insertCell();
      whyCell.colSpan = 5;
      whyCell.dataset.label = "Why";
      const reason = document.createElement("span");
      reason.className = "queue-reason";
      reason.dataset.field = "queue-reason";
      const limit = document.createElement("small");
      limit.className = "muted queue-limit";
      limit.dataset.field = "queue-limit";
      whyCell.append(reason, " ", limit);
      const eta = (models.get(entry.model) || {}).load_seconds;
      if (eta && reasonOf(entry).status !== "blocked") {
        const small = document.createElement("small");
        small.className = "muted eta";
        small.title = "how long its last load took";
        small.textContent = `loads in ~${seconds(eta)}`;
        tr.cells[4].append(document.createElement("br"), small);
      }
      tr.cells[3].dataset.epochSince = entry.since;
      if (canOperate && entry.waiters) {
        tr.cells[4].append(" ", cancelForm(entry.model, "", "Cancel all", `Cancel every queued request for ${entry.model}`));
      }
    }
    tickQueue();
    refreshReasons();
  }

  // ---- why an entry waits (the same rules as models_app/queue_reasons.py) ----------------------

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const names = (items) => (items.length === 1 ? items[0] : `${items.slice(0, -1).join(", ")} and ${items[items.length - 1]}`);

  function holder(m) {
    const n = m.in_flight || 0;
    if (m.stopping) return [`${m.name} is stopping`, "stopping"];
    if (m.pinned) return [`${m.name} is pinned${n ? `, busy (${plural(n, "request")})` : ""}`, "pinned"];
    if (n) return [`${m.name} is busy (${plural(n, "request")})`, "busy"];
    if (m.state === "loading") return [`${m.name} is loading`, "loading"];
    return [`${m.name} is idle (it will be stopped to make room)`, "idle"];
  }

  function reasonOf(entry) {
    const name = entry.model;
    const own = models.get(name) || {};
    const all = [...models.values()];
    const limit = config.max_wait === null || config.max_wait === undefined
      ? "no max wait: it waits until it can start (Settings: Max wait)"
      : `gives up after ${Number(config.max_wait)} s`;
    const result = (status, text) => ({ status, text, limit });
    const stopping = all.filter((m) => m.stopping && m.name !== name).map((m) => m.name).sort();
    if (entry.restart) return result("restart", `restarting ${name} with its changed preset`);
    if (entry.starting || RUNNING.has(own.state)) {
      if (own.state === "loading") return result("loading", `loading ${name}`);
      if (RUNNING.has(own.state)) return result("starting", `${name} is ${own.state}`);
      if (stopping.length) return result("stopping", `waiting for ${names(stopping)} to stop`);
      return result("starting", `starting ${name}`);
    }
    if (own.backoff) {
      const why = own.backoff.reason ? ` (${own.backoff.reason})` : "";
      return result("waiting", `held back after a crash loop${why}; it starts again when the back-off ends`);
    }
    const max = Number(config.models_max || 0);
    const running = all.filter((m) => RUNNING.has(m.state) && m.name !== name)
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    if (max > 0 && running.length >= max) {
      const holds = running.map(holder);
      const pinned = holds.filter(([, kind]) => kind === "pinned").length;
      const help = [];
      if (pinned) help.push(`unpin ${pinned === 1 ? "it" : "them"}`);
      if (!pinned && holds.some(([, kind]) => kind === "busy")) help.push("wait for a request to finish");
      help.push("raise Max running models");
      // Every slot pinned: nothing frees one until an operator acts, so no ETA is promised.
      const status = pinned === holds.length ? "blocked" : "waiting";
      return result(status, `waiting for a slot: ${holds.map(([text]) => text).join(", ")} — ${help.join(" or ")}`);
    }
    const ahead = Number(entry.position || 1) - 1;
    if (ahead > 0) return result("waiting", `waiting behind ${ahead} earlier ${ahead === 1 ? "entry" : "entries"}`);
    if (stopping.length) return result("waiting", `waiting for ${names(stopping)} to stop`);
    if (config.memory_budget) return result("waiting", "waiting for memory to settle under the memory budget");
    return result("waiting", "waiting for its turn");
  }

  // A card says what its queue entry says: "queued #2" only while it waits (not while it
  // loads), and the reason unless the state already says it ("loading").
  function cardReason(el, name) {
    const entry = queue.find((e) => e.model === name);
    const reason = entry ? reasonOf(entry) : null;
    const waiting = !!entry && !entry.starting && !entry.restart &&
      (reason.status === "waiting" || reason.status === "blocked");
    show(el, "queued", waiting);
    setText(el, "queue-pos", waiting ? String(entry.position) : "");
    const line = field(el, "queue-reason");
    if (line) {
      line.hidden = !reason || reason.status === "loading";
      setText(el, "queue-reason", reason ? reason.text : "");
    }
  }

  // Reasons depend on every model (who is busy, pinned, stopping): refreshed in place, so a
  // Cancel button keeps its focus.
  function refreshReasons() {
    for (const tr of document.querySelectorAll("#queue-body tr.queue-entry, #queue-body tr.queue-why")) {
      const entry = queue.find((e) => e.model === tr.dataset.model);
      if (!entry) continue;
      const reason = reasonOf(entry);
      for (const [name, text] of [["queue-status", reason.status], ["queue-reason", reason.text], ["queue-limit", `(${reason.limit})`]]) {
        const node = tr.querySelector(`[data-field="${name}"]`);
        if (node && node.textContent !== text) node.textContent = text;
      }
    }
    for (const el of root.querySelectorAll(".model-card[data-model]")) {
      if (el.dataset.model) cardReason(el, el.dataset.model);
    }
  }

  function renderWaiters(cell, entry) {
    const shown = (entry.requests || []).slice(0, QUEUE_SHOWN);
    if (!shown.length) return;
    const list = document.createElement("ul");
    list.className = "waiters";
    for (const r of shown) {
      const li = document.createElement("li");
      li.dataset.requestId = r.request_id;
      const code = document.createElement("code");
      code.title = "request id";
      code.textContent = r.request_id.length > 18 ? `${r.request_id.slice(0, 17)}…` : r.request_id;
      const actor = document.createElement("span");
      actor.className = "actor";
      actor.textContent = r.actor;
      li.append(code, " ", actor);
      if (r.kind === "load") {
        const badge = document.createElement("span");
        badge.className = "badge";
        badge.textContent = "load";
        li.append(" ", badge);
      }
      const waited = document.createElement("span");
      waited.className = "muted";
      waited.dataset.epochSince = r.since;
      li.append(" ", waited);
      if (canOperate) li.append(" ", cancelForm(entry.model, r.request_id, "Cancel", `Cancel request ${r.request_id}`));
      list.appendChild(li);
    }
    const more = entry.waiters - shown.length;
    if (more > 0) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = `and ${more} more`;
      list.appendChild(li);
    }
    cell.appendChild(list);
  }

  // A cancel form like the server renders: it posts without JavaScript, over the socket with it.
  function cancelForm(model, requestId, label, aria) {
    const form = document.getElementById("cancel-template").content.firstElementChild.cloneNode(true);
    form.querySelector('input[name="model"]').value = model;
    form.querySelector('input[name="request_id"]').value = requestId;
    const button = form.querySelector("button");
    button.textContent = label;
    button.setAttribute("aria-label", aria);
    if (!requestId) button.className = "danger";
    bindCancel(form);
    return form;
  }

  function tickQueue() {
    for (const cell of document.querySelectorAll("#queue-body [data-epoch-since]")) {
      cell.textContent = seconds(Math.max(0, Date.now() / 1000 - Number(cell.dataset.epochSince)));
    }
  }

  // ---- audit feed -------------------------------------------------------------------------------

  function renderAudit(message) {
    const list = document.getElementById("feed");
    if (message.initial) list.replaceChildren();
    const empty = list.querySelector(".empty");
    if (empty && message.rows.length) empty.remove();
    for (const row of message.rows) {
      if (list.querySelector(`li[data-id="${row.id}"]`)) continue;
      const li = document.createElement("li");
      li.dataset.id = row.id;
      li.className = `kind-${row.kind}${message.initial ? "" : " fresh"}`;
      const time = document.createElement("time");
      time.dateTime = new Date(row.time * 1000).toISOString();
      time.textContent = clock(row.time);
      const kind = document.createElement("a");
      kind.className = "badge kind";
      kind.href = row.url;
      kind.textContent = row.kind_label;
      const name = document.createElement("strong");
      name.textContent = row.model;
      const where = document.createElement("small");
      if (row.node && row.model) {
        where.className = "muted node-of";
        where.textContent = ` on ${row.node}`;
      }
      const actor = document.createElement("span");
      actor.className = "actor";
      actor.textContent = row.actor;
      const reason = document.createElement("span");
      reason.className = "reason";
      reason.textContent = row.reason;
      li.append(time, " ", kind, " ", name, where, " ", actor, " ", reason);
      li.dataset.time = row.time;
      // Newest first by event time: the writer may land a row after a later one (an eviction
      // is written once its victim has exited).
      const after = [...list.children].find((other) => Number(other.dataset.time || 0) < row.time);
      list.insertBefore(li, after || null);
    }
    while (list.children.length > FEED_ROWS) list.lastElementChild.remove();
    if (!list.children.length) {
      const li = document.createElement("li");
      li.className = "empty";
      li.textContent = "No audit events yet.";
      list.append(li);
    }
  }

  // ---- memory -----------------------------------------------------------------------------------

  function renderMemNow(system) {
    const el = document.getElementById("mem-now");
    const parts = [`${bytes(system.available)} available`, `swap ${bytes(system.swap_used)}`];
    if (system.wired !== null && system.wired !== undefined) parts.push(`wired ${bytes(system.wired)}`);
    el.replaceChildren("System: ");
    const strong = document.createElement("strong");
    strong.textContent = bytes(system.used);
    el.append(strong, ` used of ${bytes(system.total)}, ${parts.join(", ")}`);
  }

  const PALETTE = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"];
  const DASHES = [[], [8, 4], [2, 3], [10, 3, 2, 3]]; // lines differ without colour, too
  const DARK = window.matchMedia("(prefers-color-scheme: dark)");

  // A colour of the current theme (panel.css custom properties), so the charts follow dark mode.
  function ink(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function axis(extra) {
    const line = { stroke: ink("--chart-grid") };
    return { stroke: ink("--chart-axis"), grid: line, ticks: line, ...extra };
  }

  // Memory axes tick at round binary steps (0, 4, 8, 12 GiB), never at max / n (9.3, 18.6).
  const BINARY = [[1024 ** 4, "TiB"], [1024 ** 3, "GiB"], [1024 ** 2, "MiB"], [1024, "KiB"], [1, "B"]];
  const STEPS = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 512];

  function niceStep(max) {
    if (!(max > 0)) return 0;
    const raw = max / 4; // about four steps
    const [unit] = BINARY.find(([u]) => u <= raw) || [1];
    return (STEPS.find((k) => k * unit >= raw) || 1024) * unit;
  }

  function tickLabel(value, step) {
    const [unit, name] = BINARY.find(([u]) => u <= step) || [1, "B"];
    const n = value / unit;
    return `${Number.isInteger(n) ? n : n.toFixed(1)} ${name}`;
  }

  // Time ticks at whole multiples of uPlot's step in local time (:00, :15, :30), never at the
  // first sample's odd second: uPlot's own splits ticked 9:59, 10:14, 10:29 on a phone.
  function roundTimes(u, axisIdx, min, max, incr) {
    const step = Math.max(1, Math.round(incr));
    const offset = -new Date(min * 1000).getTimezoneOffset() * 60; // local = UTC + offset
    const out = [];
    for (let t = Math.ceil((min + offset) / step) * step - offset; t <= max; t += step) out.push(t);
    return out;
  }

  // A point with no neighbour (one sample, or one between gaps) is drawn as a dot: a line needs two.
  function lonely(u, seriesIdx) {
    const data = u.data[seriesIdx];
    const out = [];
    for (let i = 0; i < data.length; i++) {
      if (data[i] === null || data[i] === undefined) continue;
      if ((i === 0 || data[i - 1] == null) && (i === data.length - 1 || data[i + 1] == null)) out.push(i);
    }
    return out;
  }

  // Two charts sharing a cursor: the machine (GiB) and the models (MiB), so a 64 MiB model is
  // not a flat line under 24 GiB of available memory.
  class Plot {
    constructor(box, height, empty) {
      this.box = box;
      this.height = height;
      this.empty = empty; // said instead of an axis of "0 B, 1 B" when nothing was measured
      this.uplot = null;
      this.names = null;
      this.span = null;
    }

    // ``span``: [from, to] in epoch seconds, which the x-axis spans whatever the data (24 h,
    // 7 d); null follows the data (the live hour).
    draw(time, series, span = null) {
      const measured = series.some((s) => s.values.some((v) => v !== null && v !== undefined));
      if (!measured) {
        if (this.uplot) this.uplot.destroy();
        this.uplot = null;
        this.names = null;
        if (!this.box.querySelector(".chart-empty")) {
          const p = document.createElement("p");
          p.className = "chart-empty muted";
          p.textContent = this.empty;
          this.box.replaceChildren(p);
        }
        return;
      }
      this.span = span;
      const names = series.map((s) => s.label).join("\u0000");
      const aligned = [time, ...series.map((s) => s.values)];
      if (this.uplot && names === this.names) {
        this.uplot.setData(aligned);
        return;
      }
      if (this.uplot) this.uplot.destroy();
      this.names = names;
      this.box.replaceChildren();
      let step = 0;
      const opts = {
        width: this.width(),
        height: this.height,
        cursor: { sync: { key: "memory" }, drag: { x: false, y: false } },
        scales: {
          // The live hour follows the data, but spans two minutes at least: a few seconds of
          // samples would otherwise tick at ":31.500".
          x: { time: true, range: (u, min, max) => this.span || [Math.min(min, max - MIN_SPAN), max] },
          y: {
            range: (u, min, max) => {
              step = niceStep(max * 1.02);
              return [0, step ? Math.ceil((max * 1.02) / step) * step : 1];
            },
          },
        },
        axes: [
          axis({ label: "Time", labelSize: 20, splits: roundTimes }),
          axis({
            label: "Memory",
            labelSize: 20,
            size: 64,
            splits: (u, i, min, max) => {
              const out = [];
              for (let v = 0; step && v <= max + step / 1e6; v += step) out.push(v);
              return out;
            },
            values: (u, ticks) => ticks.map((v) => tickLabel(v, step)),
          }),
        ],
        series: [
          { value: (u, v) => (v === null ? "—" : new Date(v * 1000).toLocaleString()) },
          ...series.map((s) => ({
            label: s.label,
            stroke: s.color,
            width: s.width || 1.5,
            dash: s.dash,
            fill: s.fill ? `${s.color}22` : undefined,
            spanGaps: false, // not loaded, or no rollups: a gap, not a line across it
            points: { show: true, size: 6, fill: s.color, filter: lonely },
            value: (u, v) => bytes(v),
          })),
        ],
      };
      this.uplot = new window.uPlot(opts, aligned, this.box);
    }

    width() {
      return Math.max(260, this.box.clientWidth);
    }

    resize() {
      if (this.uplot) this.uplot.setSize({ width: this.width(), height: this.height });
    }
  }

  class MemoryChart {
    constructor(note) {
      this.note = note;
      this.range = "1h";
      this.shown = "1h";
      this.cols = { time: [], used: [], available: [], swap_used: [], wired: [], models: {} };
      const small = window.matchMedia("(max-width: 520px)").matches;
      this.system = new Plot(document.getElementById("memchart-system"), small ? 170 : 200, "No memory sample in this range yet.");
      this.models = new Plot(document.getElementById("memchart-models"), small ? 170 : 200, "No model was running in this range.");
      const observer = new ResizeObserver(() => {
        this.system.resize();
        this.models.resize();
      });
      observer.observe(this.system.box);
      DARK.addEventListener("change", () => this.restyle());
    }

    // The theme changed: build both charts again with its colours.
    restyle() {
      this.system.names = null;
      this.models.names = null;
      this.showRange(this.range);
    }

    load(history) {
      this.cols = history;
      for (const key of ["time", "used", "available", "swap_used", "wired"]) this.cols[key] = this.cols[key] || [];
      this.cols.models = this.cols.models || {};
      document.body.dataset.memoryPoints = String(this.cols.time.length);
      if (this.range === "1h") this.drawLive();
    }

    push(sample) {
      const c = this.cols;
      const last = c.time.length ? c.time[c.time.length - 1] : 0;
      if (sample.time <= last) return;
      c.time.push(sample.time);
      const s = sample.system || {};
      for (const key of ["used", "available", "swap_used", "wired"]) c[key].push(s[key] ?? null);
      const children = sample.children || {};
      for (const name of Object.keys(children)) {
        if (!c.models[name]) c.models[name] = new Array(c.time.length - 1).fill(null);
      }
      for (const [name, values] of Object.entries(c.models)) values.push(children[name] ? children[name].rss : null);
      if (c.time.length > MAX_POINTS) {
        const drop = c.time.length - MAX_POINTS;
        for (const key of ["time", "used", "available", "swap_used", "wired"]) c[key].splice(0, drop);
        for (const values of Object.values(c.models)) values.splice(0, drop);
      }
      document.body.dataset.memoryPoints = String(c.time.length);
      if (this.range === "1h") this.drawLive();
    }

    drawLive() {
      const c = this.cols;
      const system = [
        { label: "Used", values: c.used, color: ink("--chart-fg"), width: 2 },
        { label: "Available", values: c.available, color: "#16a34a", dash: [6, 4] },
        { label: "Swap used", values: c.swap_used, color: "#9333ea", dash: [2, 3] },
      ];
      if (c.wired.some((v) => v !== null)) system.push({ label: "Wired", values: c.wired, color: "#b45309", dash: [8, 3, 2, 3] });
      this.system.draw(c.time, system);
      this.models.draw(c.time, this.modelSeries(c.models, ""));
    }

    modelSeries(columns, suffix) {
      return Object.keys(columns).sort().map((name, i) => ({
        label: name + suffix,
        values: columns[name],
        color: PALETTE[i % PALETTE.length],
        dash: DASHES[i % DASHES.length],
        width: 2,
        fill: true,
      }));
    }

    async showRange(range) {
      this.range = range;
      this.note.hidden = true;
      if (range === "1h") {
        this.drawLive();
        this.shown = range;
        return;
      }
      const node = chartNode ? `&node=${encodeURIComponent(chartNode)}` : ""; // several hosts
      const response = await fetch(`${root.dataset.historyUrl}?range=${range}${node}`, { credentials: "same-origin" });
      const data = response.ok ? await response.json() : { available: false, reason: `HTTP ${response.status}` };
      if (this.range !== range) return;
      if (!data.available) {
        this.note.hidden = false;
        this.note.textContent = `No ${range} history: ${data.reason}.`;
        this.system.draw([], []);
        this.models.draw([], []);
        this.shown = range;
        return;
      }
      this.system.draw(data.time, [
        { label: "Used (avg)", values: data.system.used, color: ink("--chart-fg"), width: 2 },
        { label: "Used (max)", values: data.system.used_max, color: ink("--chart-axis"), dash: [4, 3] },
        { label: "Available (avg)", values: data.system.available, color: "#16a34a", dash: [6, 4] },
        { label: "Swap used (avg)", values: data.system.swap_used, color: "#9333ea", dash: [2, 3] },
      ], data.window);
      this.models.draw(data.time, this.modelSeries(data.models, " (avg)"), data.window);
      this.shown = range; // the range now drawn (range is the one asked for, maybe still loading)
    }
  }

  const chart = new MemoryChart(document.getElementById("chart-note"));
  for (const button of document.querySelectorAll(".ranges button[data-range]")) {
    button.addEventListener("click", () => {
      for (const other of document.querySelectorAll(".ranges button[data-range]")) other.setAttribute("aria-pressed", String(other === button));
      chart.showRange(button.dataset.range);
    });
  }

  // ---- actions ------------------------------------------------------------------------------------

  function bindActions(el) {
    const form = el.querySelector("form[data-action-form]");
    if (!form || !canOperate) return;
    form.addEventListener("submit", async (e) => {
      if (!live.isOpen()) return; // no socket: the form posts as usual
      e.preventDefault();
      const button = e.submitter;
      const action = button.value;
      const name = el.dataset.model;
      button.disabled = true;
      button.setAttribute("aria-busy", "true");
      const result = await live.action(action, name);
      button.disabled = false;
      button.removeAttribute("aria-busy");
      toast(result.ok ? result.message : `${name}: ${result.message}`, result.ok ? "ok" : "error");
    });
  }

  for (const el of root.querySelectorAll(".model-card")) bindActions(el);

  function bindCancel(form) {
    form.addEventListener("submit", async (e) => {
      if (!live.isOpen()) return; // no socket: the form posts as usual
      e.preventDefault();
      const model = form.querySelector('input[name="model"]').value;
      const requestId = form.querySelector('input[name="request_id"]').value;
      const button = form.querySelector("button");
      button.disabled = true;
      const result = await live.action("cancel", model, requestId ? { request_id: requestId } : {});
      button.disabled = false;
      toast(result.ok ? result.message : `${model}: ${result.message}`, result.ok ? "ok" : "error");
    });
  }

  for (const form of root.querySelectorAll("#queue-body form[data-cancel-form]")) bindCancel(form);

  // ---- start --------------------------------------------------------------------------------------

  const live = new Live(root.dataset.ws, {
    snapshot: applySnapshot,
    routerDown,
    event: applyEvent,
    audit: renderAudit,
    memory: (message) => chart.load(message.history),
    open: () => root.classList.remove("is-stale"),
    close: () => root.classList.add("is-stale"),
  });
  window.panelLive = live;
  window.panelChart = chart; // the memory charts, read by the browser tests
  live.start();

  setInterval(() => {
    for (const m of models.values()) tickCard(card(m.name), m);
    tickQueue();
  }, 1000);
})();
