/* The "Run adaptation" form: keeps the equivalent `day0 jobs submit` command and curl call in step with the
   form as it changes (the server rendered them for the initial values; this only re-renders them). */
(function () {
  "use strict";
  var form = document.getElementById("run-form");
  if (!form) { return; }
  var cli = document.getElementById("run-cli"), curl = document.getElementById("run-curl");
  var presets = { "default": {}, "strict": { op_cosine: 0.9999, layer_cosine: 0.999, op_max_rel_err: 0.005 },
                  "fp8": { op_cosine: 0.99, layer_cosine: 0.98, op_max_rel_err: 0.05 } };

  function num(v) { var n = Number(v); return v !== "" && isFinite(n) ? n : v; }
  function quote(s) { return /^[\w@%+=:,./-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\"'\"'") + "'"; }

  function payload() {
    var f = form.elements, body = { model: form.dataset.model, hardware: form.dataset.hardware, stages: [] };
    Array.prototype.forEach.call(form.querySelectorAll("input[name=stages]:checked"), function (c) { body.stages.push(c.value); });
    if (f.dtype.value) { body.dtype = f.dtype.value; }
    ["tp", "pp", "ep"].forEach(function (k) { if (f[k].value.trim()) { body[k] = num(f[k].value.trim()); } });
    var th = Object.assign({}, presets[f.preset.value] || {});
    f.thresholds.value.split(/[,;]/).forEach(function (item) {
      var i = item.indexOf("=");
      if (i > 0) { th[item.slice(0, i).trim()] = num(item.slice(i + 1).trim()); }
    });
    if (Object.keys(th).length) { body.thresholds = th; }
    var bench = {};
    if (f.concurrency.value.trim()) {
      bench.concurrency = f.concurrency.value.split(",").map(function (c) { return c.trim(); }).filter(Boolean).map(num);
    }
    ["input_len", "output_len", "num_prompts"].forEach(function (k) { if (f[k].value.trim()) { bench[k] = num(f[k].value.trim()); } });
    if (Object.keys(bench).length) { body.bench = bench; }
    return body;
  }

  function render() {
    var body = payload(), portal = form.dataset.portal;
    var parts = ["day0", "jobs", "submit", "--portal", portal, "--model", body.model, "--hardware", body.hardware,
                 "--stages", body.stages.join(",")];
    if (body.dtype) { parts.push("--dtype", body.dtype); }
    cli.textContent = parts.map(quote).join(" ") + " --watch";
    curl.textContent = "curl -sS -X POST " + quote(portal + "/api/v1/jobs/") + ' -H "Authorization: Bearer $DAY0_TOKEN"' +
      " -H 'Content-Type: application/json' -d " + quote(JSON.stringify(body));
  }
  form.addEventListener("input", render);
  form.addEventListener("change", render);
})();
