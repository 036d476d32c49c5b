/* Trends page: choosing another cell shows it at once (the form's Show button does the same without JS). */
(function () {
  "use strict";
  var sel = document.getElementById("cell-select");
  if (sel) { sel.addEventListener("change", function () { sel.form.submit(); }); }
})();
