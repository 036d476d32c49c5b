/* The matrix's search applies as you type and stays in the URL: the server filters every row (not only the page
   shown) and answers the first page of the matching ones as a fragment (?fragment=grid), which replaces the grid;
   ?q= is rewritten once it has. Selects and checkboxes submit the form at once (autosubmit.js). Without
   JavaScript the form still works (the <noscript> button) and the pager's links are plain links. */
(function () {
  "use strict";
  var form = document.getElementById("matrix-filters");
  if (!form) { return; }
  var search = document.getElementById("matrix-search");
  var grid = document.getElementById("matrix-grid");
  var count = document.getElementById("matrix-count");
  if (!search || !grid || !window.fetch) { return; }  // selects and checkboxes apply through autosubmit.js

  var timer = null, asked = 0;

  function urlFor(q) {
    var url = new URL(location.href);
    if (q) { url.searchParams.set("q", q); } else { url.searchParams.delete("q"); }
    url.searchParams.delete("page");  // a new search starts on its first page
    return url;
  }

  function apply() {
    var q = search.value.trim();
    var url = urlFor(q);
    var mine = ++asked;
    var fragment = new URL(url);
    fragment.searchParams.set("fragment", "grid");
    fetch(fragment.pathname + fragment.search, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) {
        if (mine !== asked) { return; }  // a newer keystroke's answer wins
        grid.innerHTML = html;
        var page = grid.querySelector(".matrix-page");
        if (count && page) { count.textContent = page.dataset.count; }
        history.replaceState(null, "", url.pathname + url.search + url.hash);
        grid.dispatchEvent(new CustomEvent("matrix:replaced", {bubbles: true}));
      })
      .catch(function () { if (mine === asked) { location.assign(url.pathname + url.search); } });
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(apply, 150);
  }
  search.addEventListener("input", later);
  search.addEventListener("keydown", function (e) {
    if (e.key === "Enter") { e.preventDefault(); clearTimeout(timer); apply(); }
  });
})();
