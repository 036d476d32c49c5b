/* Live job console: follows /ws/jobs/<id>/?after=SEQ, appends log lines, moves the stage timeline and the
   progress bars, filters by level, auto-scrolls, reconnects with replay from the last seq seen. */
(function () {
  "use strict";
  var root = document.getElementById("job-console");
  if (!root) { return; }

  var log = document.getElementById("job-log");
  var statusEl = document.getElementById("ws-status");
  var stateEl = document.getElementById("job-state");
  var autoScroll = document.getElementById("auto-scroll");
  var lastSeq = parseInt(root.dataset.lastSeq || "0", 10);
  var FINISHED = /^(succeeded|failed|cancelled|lost)$/;
  var finished = FINISHED.test(root.dataset.state || "");
  var retry = 0;
  var socket = null;
  var MAX_LINES = 5000;

  function setStatus(text, cls) {
    statusEl.textContent = text;
    statusEl.className = "ws-status " + cls;
  }

  function stageItem(stage) {
    if (!stage) { return null; }
    var li = root.querySelector('.stage-timeline [data-stage="' + stage + '"]');
    if (!li) {
      li = document.createElement("li");
      li.dataset.stage = stage;
      li.dataset.status = "pending";
      li.innerHTML = '<span class="stage-name"></span> <span class="stage-status">pending</span>' +
        '<progress max="1" value="0"></progress><span class="progress-text"></span>';
      li.querySelector(".stage-name").textContent = stage;
      root.querySelector(".stage-timeline").appendChild(li);
    }
    return li;
  }

  var STATUS_TEXT = { pending: "pending", running: "running", done: "✓ done", failed: "✗ failed", skipped: "skipped" };

  function setStageStatus(li, status) {
    if (!li || li.dataset.status === status) { return; }
    if ((li.dataset.status === "done" || li.dataset.status === "failed") && status === "running") { return; }
    li.dataset.status = status;
    li.querySelector(".stage-status").textContent = STATUS_TEXT[status] || status;
    if (status === "done") {
      var bar = li.querySelector("progress");
      bar.max = 1; bar.value = 1;
    }
    if (status === "failed") { skipPending(); }
  }

  // After a failure (or once the job ended), stages that never started will not run: "skipped".
  function skipPending() {
    Array.prototype.forEach.call(root.querySelectorAll('.stage-timeline [data-status="pending"]'), function (li) {
      setStageStatus(li, "skipped");
    });
  }

  function showEnd(state) {
    var text = { succeeded: "✓ finished: succeeded", failed: "✗ finished: failed", cancelled: "⊘ cancelled",
                 lost: "✗ lost (its agent stopped reporting)" }[state] || state;
    setStatus(text, "ended");
  }

  /* Event kinds (agents/pipeline/base.py): stage_started, stage_finished (data.passed), progress
     (data.done, data.total, data.what), log, result. */
  function applyToTimeline(ev) {
    var li = stageItem(ev.stage || (ev.data && ev.data.stage));
    if (!li) { return; }
    var data = ev.data || {};
    if (ev.kind === "stage_finished") {
      setStageStatus(li, data.passed === false ? "failed" : "done");
      if (data.seconds !== undefined && data.seconds !== null) {
        li.querySelector(".progress-text").textContent = Number(data.seconds).toFixed(1) + " s";
      }
      return;
    }
    setStageStatus(li, "running");
    if (ev.kind === "progress") {
      var done = Number(data.done), total = Number(data.total);
      if (isFinite(done) && isFinite(total) && total > 0) {
        var bar = li.querySelector("progress");
        bar.max = total; bar.value = Math.min(done, total);
        li.querySelector(".progress-text").textContent = (data.what ? data.what + ": " : "") +
          done + "/" + total + " (" + Math.round(100 * done / total) + "%)";
      }
    }
  }

  function appendLine(ev) {
    var level = String(ev.level || "info").toLowerCase();
    var li = document.createElement("li");
    li.className = "log-line level-" + level + (String(ev.message || "").indexOf("\n") !== -1 ? " multiline" : "");
    li.dataset.seq = ev.seq;
    li.dataset.level = level;
    var t = document.createElement("time");
    t.dateTime = ev.ts || "";
    t.textContent = ev.ts ? String(ev.ts).replace("T", " ").slice(11, 19) : "";
    var stage = document.createElement("span");
    stage.className = "log-stage";
    stage.textContent = ev.stage || "";
    var lvl = document.createElement("span");
    lvl.className = "log-level";
    lvl.textContent = level.toUpperCase();
    var msg = document.createElement("span");
    msg.className = "log-msg";
    msg.textContent = ev.message || ev.kind || "";
    li.append(t, " ", stage, " ", lvl, " ", msg);
    log.appendChild(li);
    while (log.children.length > MAX_LINES) { log.removeChild(log.firstChild); }
  }

  function onEvent(ev) {
    var seq = Number(ev.seq);
    if (!isFinite(seq) || seq <= lastSeq) { return; } // replay overlap: each event once
    lastSeq = seq;
    root.dataset.lastSeq = String(seq);
    if (ev.kind !== "progress") { appendLine(ev); }
    applyToTimeline(ev);
  }

  function setState(state) {
    if (!state) { return; }
    root.dataset.state = state;
    stateEl.textContent = state;
    stateEl.className = "job-state state-" + state;
    finished = FINISHED.test(state);
    var cancel = document.getElementById("cancel-job");
    if (cancel && finished) { cancel.disabled = true; }
    if (finished) {
      showEnd(state);
      if (state !== "succeeded") { skipPending(); }
      var banner = document.getElementById("no-agent");
      if (banner) { banner.hidden = true; }
    }
  }

  /* Messages (apps/jobs/events.py): {type: "job.events", events: [...]}, {type: "job.state", state, ...}. */
  function onMessage(msg) {
    if (msg.type === "job.state") {
      setState(msg.state);
      if (msg.error && /^(failed|lost)$/.test(msg.state)) { document.getElementById("job-error").textContent = msg.error; }
      return;
    }
    var events = msg.events || (msg.event ? [msg.event] : []);
    events.forEach(onEvent);
    if (events.length && autoScroll.checked) { log.scrollTop = log.scrollHeight; }
  }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(proto + location.host + root.dataset.wsPath + "?after=" + lastSeq);
    setStatus("connecting…", "connecting");
    socket.onopen = function () {
      retry = 0;
      if (finished) { showEnd(root.dataset.state); } else { setStatus("live", "live"); }
    };
    socket.onmessage = function (e) {
      try { onMessage(JSON.parse(e.data)); } catch (err) { console.error("bad job message", err, e.data); }
    };
    socket.onclose = function (e) {
      socket = null;
      if (e.code === 4403 || e.code === 4404) { setStatus("not allowed", "closed"); return; }
      if (finished) { showEnd(root.dataset.state); return; }  // nothing more will come
      var delay = Math.min(8000, 500 * Math.pow(2, retry++));
      setStatus("disconnected — reconnecting in " + Math.round(delay / 1000) + " s", "closed");
      setTimeout(connect, delay);
    };
  }

  // A user scrolling up pauses auto-scroll; scrolling back to the bottom resumes it.
  log.addEventListener("scroll", function () {
    var atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
    autoScroll.checked = atBottom;
  });

  autoScroll.addEventListener("change", function () {
    if (autoScroll.checked) { log.scrollTop = log.scrollHeight; }
  });

  Array.prototype.forEach.call(root.querySelectorAll("input[data-level-filter]"), function (box) {
    box.addEventListener("change", function () {
      log.classList.toggle("hide-" + box.dataset.levelFilter, !box.checked);
    });
    log.classList.toggle("hide-" + box.dataset.levelFilter, !box.checked);
  });

  var cancel = document.getElementById("cancel-job");
  if (cancel) {
    cancel.addEventListener("click", function () {
      if (!window.confirm("Cancel this job?")) { return; }
      cancel.disabled = true;
      var csrf = (document.cookie.match(/(?:^|; )csrftoken=([^;]+)/) || [])[1] || root.dataset.csrf;
      fetch(root.dataset.cancelUrl, { method: "POST", credentials: "same-origin",
        headers: { "X-CSRFToken": csrf, "Content-Type": "application/json", "Accept": "application/json" },
        body: "{}" })
        .then(function (r) { return r.json().then(function (b) { return { ok: r.ok, body: b }; }); })
        .then(function (r) {
          if (!r.ok) { cancel.disabled = false; window.alert("Cancel refused: " + (r.body.detail || JSON.stringify(r.body))); return; }
          setState(r.body.state || "cancelled");
        })
        .catch(function (err) { cancel.disabled = false; window.alert("Cancel failed: " + err); });
    });
  }

  log.scrollTop = log.scrollHeight;
  connect();
  window.day0JobConsole = { lastSeq: function () { return lastSeq; }, socket: function () { return socket; } };
})();
