"""The built-in engines as they are now: vLLM bound to loopback (``--host 127.0.0.1``), and the bundled runtime
serving tools and structured output (tool calls and ``response_format`` landed in the runtime). A row an operator
edited after 0007 seeded it is left as it is."""

from django.db import migrations

OLD_VLLM = ("vllm serve {model_path} --port {port} --dtype {dtype} --tensor-parallel-size {tp} "
            "--max-model-len {max_model_len} {extra}")
NEW_VLLM = ("vllm serve {model_path} --port {port} --host 127.0.0.1 --dtype {dtype} "
            "--tensor-parallel-size {tp} --max-model-len {max_model_len} {extra}")
OLD_DAY0 = {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": False, "structured_output": False}
NEW_DAY0 = {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": True, "structured_output": True}


def forward(apps, schema_editor):
    Engine = apps.get_model("catalog", "Engine")
    Engine.objects.filter(name="vllm", version="0.32.0", command=OLD_VLLM).update(command=NEW_VLLM)
    for row in Engine.objects.filter(name="day0", version=""):
        if row.capabilities == OLD_DAY0:
            row.capabilities = NEW_DAY0
            row.save(update_fields=["capabilities"])


def backward(apps, schema_editor):
    Engine = apps.get_model("catalog", "Engine")
    Engine.objects.filter(name="vllm", version="0.32.0", command=NEW_VLLM).update(command=OLD_VLLM)
    for row in Engine.objects.filter(name="day0", version=""):
        if row.capabilities == NEW_DAY0:
            row.capabilities = OLD_DAY0
            row.save(update_fields=["capabilities"])


class Migration(migrations.Migration):
    dependencies = [("catalog", "0008_quantized_from")]
    operations = [migrations.RunPython(forward, backward)]
