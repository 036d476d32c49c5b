/* Operator checklist filter: the status chips filter rows in place (the links work without JavaScript). */
(function () {
  "use strict";
  var box = document.getElementById("checklist");
  if (!box) { return; }
  box.addEventListener("click", function (e) {
    var chip = e.target.closest("[data-status-filter]");
    if (!chip) { return; }
    e.preventDefault();
    box.dataset.filter = chip.dataset.statusFilter;
    Array.prototype.forEach.call(box.querySelectorAll("[data-status-filter]"), function (c) {
      c.setAttribute("aria-current", c === chip ? "true" : "false");
    });
  });
})();
