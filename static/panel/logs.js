// A model's log, tailed live: the ring buffer on connect, then each model.log event. Lines are
// shown as models_app/views/logs.py renders them (one clock, a level); the box filters them.
(function () {
  "use strict";
  const { Live, EVENTS, clock } = window.Panel;
  const log = document.getElementById("log");
  if (!log) return;
  const model = log.dataset.model;
  const follow = document.getElementById("follow");
  const badge = document.getElementById("log-state");
  const MAX_LINES = 5000;
  let lastTime = 0;
  let pending = []; // lines that arrived before the ring
  const search = document.getElementById("log-search");
  const count = document.getElementById("log-count");
  // Mirrors CLOCK and LEVELS in models_app/views/logs.py.
  const CLOCK = /^(\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?)\s+/;
  const LEVELS = [
    ["error", /\b(?:ERROR|FATAL|CRITICAL|PANIC)\b|\b[Ee]rror:|^E /],
    ["warn", /\bWARN(?:ING)?\b|\b[Ww]arning:|^W /],
    ["debug", /\bDEBUG\b|^D /],
  ];

  function shown(line) {
    const match = CLOCK.exec(line.text);
    const millis = String(new Date(line.time * 1000).getMilliseconds()).padStart(3, "0");
    const text = match ? line.text.slice(match[0].length) : line.text;
    const level = (LEVELS.find(([, pattern]) => pattern.test(text)) || ["info"])[0];
    return { clock: match ? match[1] : `${clock(line.time)}.${millis}`, text, level };
  }

  function matches(div) {
    const query = search.value.trim().toLowerCase();
    return !query || div.textContent.toLowerCase().includes(query);
  }

  function filter() {
    let total = 0;
    let hits = 0;
    for (const div of log.querySelectorAll(".line:not(.empty)")) {
      total += 1;
      div.hidden = !matches(div);
      if (!div.hidden) hits += 1;
    }
    count.textContent = search.value.trim() ? `${hits} of ${total} lines` : "";
  }

  function add(line) {
    const empty = log.querySelector(".empty");
    if (empty) empty.remove();
    const div = document.createElement("div");
    const view = shown(line);
    div.className = `line s-${line.stream} lv-${view.level}`;
    const t = document.createElement("span");
    t.className = "t";
    t.textContent = view.clock;
    const x = document.createElement("span");
    x.className = "x";
    x.textContent = view.text;
    div.append(t, x);
    div.hidden = !matches(div);
    log.appendChild(div);
    lastTime = Math.max(lastTime, line.time);
    while (log.children.length > MAX_LINES) log.firstElementChild.remove();
  }

  function scroll() {
    if (follow.checked) log.scrollTop = log.scrollHeight;
  }

  function state(text, cls) {
    badge.hidden = false;
    badge.textContent = text;
    badge.className = `badge state-${cls}`;
  }

  const live = new Live(log.dataset.ws, {
    open: () => {
      pending = [];
      live.send({ type: "logs", model });
    },
    logs: (message) => {
      if (message.model !== model) return;
      log.replaceChildren();
      lastTime = 0;
      for (const line of message.lines) add(line);
      for (const line of pending) if (line.time > lastTime) add(line);
      pending = null;
      if (!log.children.length) log.innerHTML = '<div class="line empty">No output yet.</div>';
      filter();
      scroll();
    },
    snapshot: (snap) => {
      const m = snap.models.find((row) => row.name === model);
      if (m) state(m.state + (m.stopping ? " · stopping" : ""), m.state);
    },
    event: (ev) => {
      const d = ev.data || {};
      if (ev.type === EVENTS.MODEL_LOG && d.model === model) {
        if (pending) pending.push(d);
        else if (d.time >= lastTime) {
          add(d);
          if (search.value.trim()) filter();
          scroll();
        }
      } else if (ev.type === EVENTS.MODEL_STATE && d.model === model) {
        state(d.to + (d.stopping ? " · stopping" : ""), d.to);
      }
    },
  });
  window.panelLive = live;
  search.addEventListener("input", () => {
    filter();
    scroll();
  });
  document.getElementById("log-search-box").hidden = false; // it needs JavaScript
  scroll();
  live.start();
})();
