"""A cell is model × hardware × engine@version: every existing cell is the bundled runtime's (``day0``, the
default engine catalog migration 0007 seeds); the unique key gains the engine."""

import django.db.models.deletion
from django.db import migrations, models

DAY0 = {"name": "day0", "version": "", "default": True, "executable": "", "obtained_by": "bundled with the agent",
        "command": "", "capabilities": {"logprobs": True, "prompt_logprobs": True, "images": True, "tools": False,
                                        "structured_output": False},
        "notes": "the bundled runtime (day0 serve): every stage, internals included"}


def cells_on_day0(apps, schema_editor):
    Engine = apps.get_model("catalog", "Engine")
    Cell = apps.get_model("matrix", "Cell")
    engine = Engine.objects.filter(default=True).order_by("id").first()
    if engine is None:
        engine, _ = Engine.objects.get_or_create(name=DAY0["name"], version=DAY0["version"], defaults=DAY0)
    Cell.objects.filter(engine__isnull=True).update(engine=engine)


class Migration(migrations.Migration):

    dependencies = [
        ("catalog", "0007_engine"),
        ("matrix", "0005_cell_history"),
    ]

    operations = [
        migrations.AddField(
            model_name="cell",
            name="engine",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="cells",
                                    to="catalog.engine"),
        ),
        migrations.RunPython(cells_on_day0, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="cell",
            name="engine",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="cells",
                                    to="catalog.engine"),
        ),
        migrations.RemoveConstraint(model_name="cell", name="uniq_cell"),
        migrations.AddConstraint(
            model_name="cell",
            constraint=models.UniqueConstraint(fields=("model", "hardware", "engine"), name="uniq_cell_engine"),
        ),
    ]
