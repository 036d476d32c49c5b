/* The matrix's search applies as you type and stays in the URL: the rows that do not match are hidden (no
   reload) and ?q= rewritten. Selects and checkboxes submit the form at once (autosubmit.js). Without
   JavaScript the form still works (the <noscript> button). */
(function () {
  "use strict";
  var form = document.getElementById("matrix-filters");
  if (!form) { return; }
  var search = document.getElementById("matrix-search");
  var table = document.getElementById("matrix");
  var count = document.getElementById("matrix-count");
  var none = document.getElementById("matrix-none");
  var onlyRegressed = form.querySelector("input[name=regressed]");

  if (!search || !table) { return; }  // selects and checkboxes apply through autosubmit.js

  function apply() {
    var q = search.value.trim().toLowerCase();
    var rows = table.tBodies[0].rows, shown = 0;
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i];
      var ok = (!q || row.dataset.search.indexOf(q) !== -1) &&
               (!onlyRegressed || !onlyRegressed.checked || row.dataset.regressed === "true");
      row.hidden = !ok;
      if (ok) { shown++; }
    }
    if (count) { count.textContent = count.textContent.replace(/^\d+/, String(shown)); }
    if (none) { none.hidden = shown > 0; }
    var url = new URL(location.href);
    if (q) { url.searchParams.set("q", search.value.trim()); } else { url.searchParams.delete("q"); }
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  search.addEventListener("input", apply);
  search.addEventListener("keydown", function (e) { if (e.key === "Enter") { e.preventDefault(); apply(); } });
})();
