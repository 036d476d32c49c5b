"""The standard harness against ``day0 serve``: ``lm-eval --model local-completions`` (the optional ``eval``
extra) runs multiple-choice, loglikelihood, rolling-loglikelihood and generation tasks in batched requests,
through the API key, and every log-likelihood it got equals transformers' fp32 one on the same tokens."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agents.runtime.server.launcher import free_port
from agents.runtime.testing.make_model import cached_model
from tests.runtime.served import wait_until_ready

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "contract" / "suites"  # the project's own suites, when present

MC = [
    ("What is the capital of France?", ["Paris", "Lyon", "Madrid", "Berlin"], 0),
    ("How many legs does a cat have?", ["two", "four", "six", "eight"], 1),
    ("What colour is the sky on a clear day?", ["green", "red", "blue", "black"], 2),
    ("Which number is the largest?", ["3", "7", "1", "12"], 3),
    ("What do bees make?", ["honey", "milk", "silk", "paper"], 0),
    ("Which animal barks?", ["cat", "dog", "fish", "bird"], 1),
]
LL = [("The sun rises in the", " east"), ("Two plus two is", " four"), ("Water freezes at zero", " degrees")]
TEXT = ["A short paragraph of held-out text, scored token by token in rolling windows.",
        "Another one: the harness splits it into windows no longer than the context."]


def _tasks(root: Path) -> list[str]:
    """Tiny local tasks in lm-eval's format (data beside them, no downloads)."""
    data = {
        "day0t_mc": [{"question": q, "choices": c, "answer": a} for q, c, a in MC],
        "day0t_ll": [{"context": c, "continuation": t} for c, t in LL],
        "day0t_rolling": [{"text": t} for t in TEXT],
        "day0t_gen": [{"question": q, "answer": c[a]} for q, c, a in MC[:3]],
    }
    bodies = {
        "day0t_mc": ("output_type: multiple_choice\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
                     "doc_to_choice: choices\ndoc_to_target: answer\ntarget_delimiter: \" \"\n"
                     "metric_list:\n  - metric: acc\n"),
        "day0t_ll": ("output_type: loglikelihood\ndoc_to_text: \"{{context}}\"\ndoc_to_target: \"{{continuation}}\"\n"
                     "target_delimiter: \"\"\nmetric_list:\n  - metric: perplexity\n  - metric: acc\n"),
        "day0t_rolling": ("output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
                          "metric_list:\n  - metric: word_perplexity\n"),
        "day0t_gen": ("output_type: generate_until\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
                      "doc_to_target: answer\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 6\n"
                      "  do_sample: false\nmetric_list:\n  - metric: exact_match\n"),
    }
    for name, rows in data.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / name}.jsonl\n"
            f"test_split: test\n{bodies[name]}metadata:\n  version: 1.0\n")
    return list(data)


def _encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:  # noqa: ANN001
    """lm-eval's own split: trailing spaces of the context move to the continuation; tokens of the whole."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False)
    ctx = tok.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


@pytest.mark.slow  # the harness imports for ~30 s on a busy host
def test_lm_eval_local_completions_runs_against_day0_serve(tmp_path):
    pytest.importorskip("lm_eval", reason="the optional 'eval' extra (pip install -e '.[eval]')")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = cached_model("llama")
    tasks = _tasks(tmp_path)
    if (SUITES / "day0_mc.yaml").exists():  # the project's suite too (its data path is relative to the repository)
        (tmp_path / "day0_mc.yaml").write_text((SUITES / "day0_mc.yaml").read_text())
        tasks.append("day0_mc")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "DAY0_API_KEY": "eval-key", "OPENAI_API_KEY": "eval-key"}
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "day0cli", "serve", str(model_dir), "--port", str(port), "--num-blocks",
             "256", "--served-model-name", "tiny"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        wait_until_ready(url, server, log)
        results_dir = tmp_path / "results"
        run = subprocess.run(
            [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
             f"model=tiny,base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={model_dir},"
             "max_length=1000,num_concurrent=2", "--batch_size", "4", "--include_path", str(tmp_path),
             "--tasks", ",".join(tasks), "--limit", "12", "--output_path", str(results_dir), "--log_samples"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    results = json.loads(next(results_dir.rglob("results_*.json")).read_text())["results"]
    assert 0.0 <= results["day0t_mc"]["acc,none"] <= 1.0
    assert math.isfinite(results["day0t_ll"]["perplexity,none"])
    assert results["day0t_rolling"]["word_perplexity,none"] > 1.0
    assert "exact_match,none" in results["day0t_gen"]
    # every log-likelihood equals the reference's on the tokens lm-eval sent
    tok = AutoTokenizer.from_pretrained(model_dir)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    checked = 0
    for name in ("day0t_mc", "day0t_ll"):
        for line in next(results_dir.rglob(f"samples_{name}_*.jsonl")).read_text().splitlines():
            sample = json.loads(line)
            for args, resp in zip(sample["arguments"].values(), sample["resps"], strict=True):
                ctx, cont = _encode_pair(tok, args["arg_0"], args["arg_1"])
                ids = ctx + cont
                with torch.no_grad():
                    logp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), dim=-1)
                want = sum(logp[p - 1, ids[p]].item() for p in range(len(ctx), len(ids)))
                assert float(resp[0][0]) == pytest.approx(want, abs=1e-3)
                checked += 1
    assert checked == 6 * 4 + 3
