"""Manifests come from the publisher, staff or the reference run. A manifest recorded from a vendor's first
passing load ("first seen") is kept and shown as "first seen (legacy)", never compared with again; the
release-wide digest_conflict flag (stamped by any load, never cleared) goes: disagreements between hardware
are computed from each hardware's newest passing load instead."""

from django.db import migrations, models


def mark_legacy(apps, schema_editor):
    ModelRelease = apps.get_model("catalog", "ModelRelease")
    ModelRelease.objects.filter(manifest_source="first seen").update(manifest_source="first seen (legacy)")


def unmark_legacy(apps, schema_editor):
    ModelRelease = apps.get_model("catalog", "ModelRelease")
    ModelRelease.objects.filter(manifest_source="first seen (legacy)").update(manifest_source="first seen")
    ModelRelease.objects.filter(manifest_source__in=["staff", "reference"]).update(manifest_source="given")


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0004_hardware_reference'),
    ]

    operations = [
        migrations.AlterField(
            model_name='modelrelease',
            name='manifest_source',
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.RunPython(mark_legacy, unmark_legacy),
        migrations.RemoveField(
            model_name='modelrelease',
            name='digest_conflict',
        ),
    ]
