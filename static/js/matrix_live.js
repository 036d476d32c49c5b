/* Live matrix: follows /ws/matrix/ and updates a cell in place when its tier, failure or fit changes
   ("cell.changed"); other changes ("matrix.changed": a new model, refreshed estimates) offer a reload.
   Cells are found by their link, /cells/<model>/<hardware>/, so the server-rendered table needs no ids. */
(function () {
  "use strict";
  var table = document.getElementById("matrix");
  if (!table || !window.WebSocket) { return; }
  var retry = 0;

  var status = document.createElement("p");
  status.id = "matrix-live";
  status.className = "matrix-live";
  status.setAttribute("role", "status");
  status.style.cssText = "margin:4px 0 8px;font-size:0.85rem;color:#4b5563";
  table.parentNode.insertBefore(status, table);

  function say(text, cls) { status.textContent = text; status.dataset.state = cls; }

  function span(cls, text) {
    var s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    return s;
  }

  function updateCell(msg) {
    var link = table.querySelector('a[href="/cells/' + CSS.escape(msg.model) + "/" + CSS.escape(msg.hardware) + '/"]');
    if (!link) { return false; }
    var td = link.closest("td");
    var before = td.className;
    td.className = "cell tier-" + msg.tier + (msg.failed_stage ? " failed-cell" : "") + " live-updated";
    var lead = link.querySelector(".lead");
    var oldTier = (before.match(/\btier-(\d)\b/) || [])[1];
    var keepLead = lead && oldTier === String(msg.tier);  // the lead time belongs to the tier shown
    link.textContent = "";
    link.appendChild(span("tier-label", msg.tier + " · " + msg.tier_name));
    if (msg.failed_stage) { link.appendChild(span("failed", "failed at " + msg.failed_stage)); }
    if (msg.fits === true) {  // the column header holds the hardware's name (the message carries its slug)
      var header = table.tHead && table.tHead.rows[0].cells[td.cellIndex];
      var fits = span("fits", "fits on " + msg.fits_devices + " × " + ((header && header.dataset.name) || msg.hardware));
      fits.title = msg.fits_devices + " × " + msg.hardware;
      link.appendChild(fits);
    }
    else if (msg.fits === false) { link.appendChild(span("fits no-fit", "does not fit")); }
    if (keepLead) { link.appendChild(lead); }
    td.style.boxShadow = "inset 0 0 0 3px #2563eb";  // this page loads only the base stylesheet
    td.title = "updated live at " + new Date().toLocaleTimeString();
    td.dataset.liveTier = String(msg.tier);
    return true;
  }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + "/ws/matrix/");
    ws.onopen = function () { retry = 0; say("● live: cells update as evidence arrives", "live"); };
    ws.onmessage = function (e) {
      var msg;
      try { msg = JSON.parse(e.data); } catch (err) { return; }
      if (msg.type === "cell.changed") {
        if (!updateCell(msg)) { say("● live: a cell outside this view changed — reload to see it", "stale"); }
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
