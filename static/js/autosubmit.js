/* Filter forms (class "filters") apply as soon as a select or checkbox changes; empty fields stay out of the URL.
   Without JavaScript, the form's <noscript> button submits it. */
(function () {
  "use strict";
  Array.prototype.forEach.call(document.querySelectorAll("#matrix-filters, #job-filters, #regression-filters"), function (form) {
    form.addEventListener("change", function (e) {
      if (e.target.matches("select, input[type=checkbox], input[type=date]")) { form.requestSubmit(); }
    });
    form.addEventListener("submit", function () {
      Array.prototype.forEach.call(form.elements, function (el) { if (el.name && !el.value) { el.disabled = true; } });
    });
  });
})();
