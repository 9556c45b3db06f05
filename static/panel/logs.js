// A model's log, tailed live: the ring buffer on connect, then each model.log event.
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

  function add(line) {
    const empty = log.querySelector(".empty");
    if (empty) empty.remove();
    const div = document.createElement("div");
    div.className = `line s-${line.stream}`;
    const t = document.createElement("span");
    t.className = "t";
    t.textContent = clock(line.time);
    const x = document.createElement("span");
    x.className = "x";
    x.textContent = line.text;
    div.append(t, x);
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
          scroll();
        }
      } else if (ev.type === EVENTS.MODEL_STATE && d.model === model) {
        state(d.to + (d.stopping ? " · stopping" : ""), d.to);
      }
    },
  });
  window.panelLive = live;
  scroll();
  live.start();
})();
