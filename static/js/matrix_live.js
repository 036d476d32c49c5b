/* Live matrix: follows /ws/matrix/ and updates a cell in place when its tier, failure or fit changes
   ("cell.changed"); other changes ("matrix.changed": a new model, refreshed estimates) offer a reload.
   Cells are found by their link, /cells/<model>/<hardware>/, so the server-rendered table needs no ids. The grid
   shows one page of rows and the search replaces it (matrix_filters.js): the table is looked up at each message,
   and a change to a model on another page is left to that page (the server renders it afresh). */
(function () {
  "use strict";
  var grid = document.getElementById("matrix-grid");
  if (!grid || !window.WebSocket) { return; }
  var retry = 0;
  var LIVE = "● live: cells update as evidence arrives";

  var status = document.createElement("p");
  status.id = "matrix-live";
  status.className = "matrix-live";
  status.setAttribute("role", "status");
  status.style.cssText = "margin:4px 0 8px;font-size:0.85rem;color:#4b5563";
  grid.parentNode.insertBefore(status, grid);

  function say(text, cls) { status.textContent = text; status.dataset.state = cls; }

  function span(cls, text) {
    var s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    return s;
  }

  function onThisPage(model) {
    var rows = grid.querySelectorAll("tbody tr[data-model]");
    for (var i = 0; i < rows.length; i++) { if (rows[i].dataset.model === model) { return true; } }
    return false;
  }

  function updateCell(msg) {
    var link = grid.querySelector('a[href="/cells/' + CSS.escape(msg.model) + "/" + CSS.escape(msg.hardware) + '/"]');
    if (!link) { return false; }
    var td = link.closest("td");
    // the grid shows one engine per model × hardware (the best): another engine's change is left to a reload
    if (msg.engine && (td.dataset.engine || "day0") !== msg.engine) { return false; }
    var oldTier = td.dataset.tier;
    var since = link.querySelector(".since");
    var flag = link.querySelector(".reg-open");
    var keepSince = since && oldTier === String(msg.tier);  // the date and lead time belong to the tier shown
    link.textContent = "";
    if (msg.tier === 0 && !msg.failed_stage) {  // untested: the fit on one muted line, as the server renders it
      td.className = "cell untested" + (msg.fits === false ? " no-fit" : "") + " live-updated";
      var fitLine = td.title.match(/in (\S+)$/m);
      var dtype = fitLine ? fitLine[1] : "";
      link.appendChild(span("fit-line", msg.fits === true ? "fits " + msg.fits_devices + "× · " + dtype
        : msg.fits === false ? "no fit · " + dtype : "fit unknown"));
    } else {
      td.className = "cell tier-" + msg.tier + (msg.failed_stage ? " failed-cell" : "") + " live-updated";
      link.appendChild(span("tier-label", "T" + msg.tier + " " + msg.tier_name));
      if (msg.failed_stage) { link.appendChild(span("failed", "✗ at " + msg.failed_stage)); }
      if (keepSince) { link.appendChild(since); }
      else if (msg.tier > 0) { link.appendChild(span("since", "reached just now")); }
    }
    if (flag) { link.appendChild(flag); }
    td.dataset.tier = String(msg.tier);
    td.style.boxShadow = "inset 0 0 0 3px #2563eb";
    td.title = "updated live at " + new Date().toLocaleTimeString() + "\n" + td.title;
    td.dataset.liveTier = String(msg.tier);
    return true;
  }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + "/ws/matrix/");
    ws.onopen = function () { retry = 0; say(LIVE, "live"); };
    ws.onmessage = function (e) {
      var msg;
      try { msg = JSON.parse(e.data); } catch (err) { return; }
      if (msg.type === "cell.changed") {
        if (updateCell(msg)) { if (status.dataset.state === "live") { say(LIVE, "live"); } return; }
        if (onThisPage(msg.model)) { say("● live: a cell outside this view changed — reload to see it", "stale"); }
        else if (status.dataset.state === "live") { say(LIVE + " (a model on another page changed)", "live"); }
      } else if (msg.type === "matrix.changed") {
        status.textContent = "● live: the matrix changed — ";
        var a = document.createElement("a");
        a.href = location.href;
        a.textContent = "reload";
        status.appendChild(a);
        status.dataset.state = "stale";
      }
    };
    ws.onclose = function (e) {
      if (e.code === 4401 || e.code === 4403) { say("live updates unavailable", "closed"); return; }
      var delay = Math.min(10000, 500 * Math.pow(2, retry++));
      say("○ reconnecting…", "closed");
      setTimeout(connect, delay);
    };
  }
  connect();
})();
