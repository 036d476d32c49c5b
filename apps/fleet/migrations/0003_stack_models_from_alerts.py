# The stack models, moved from the alerts app (alerts 0002): state only, their tables keep the alerts_ names.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0006_reference_source'),
        ('fleet', '0002_initial'),
        ('alerts', '0002_stack_models_to_fleet'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='HardwarePolicy',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('policy', models.CharField(choices=[('off', 'record stack changes only'), ('tier', 're-validate cells at or above a tier'), ('all', 're-validate every cell with evidence')], default='off', max_length=8)),
                    ('min_tier', models.PositiveSmallIntegerField(default=1)),
                    ('updated_at', models.DateTimeField(auto_now=True)),
                    ('hardware', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='stack_policy', to='catalog.hardware')),
                ],
                options={
                    'verbose_name_plural': 'hardware policies',
                    'db_table': 'alerts_hardwarepolicy',
                },
            ),
            migrations.CreateModel(
                name='HardwareStack',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('lock', models.JSONField(default=dict)),
                    ('reported_by', models.CharField(blank=True, max_length=255)),
                    ('updated_at', models.DateTimeField(auto_now=True)),
                    ('hardware', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='stack', to='catalog.hardware')),
                ],
                options={
                    'db_table': 'alerts_hardwarestack',
                },
            ),
            migrations.CreateModel(
                name='StackChange',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('hostname', models.CharField(blank=True, max_length=255)),
                    ('before', models.JSONField(default=dict)),
                    ('after', models.JSONField(default=dict)),
                    ('changed', models.JSONField(default=list, help_text='the keys whose values differ')),
                    ('policy', models.CharField(choices=[('off', 'record stack changes only'), ('tier', 're-validate cells at or above a tier'), ('all', 're-validate every cell with evidence')], default='off', max_length=8)),
                    ('jobs', models.JSONField(blank=True, default=list, help_text='ids of the re-validation jobs queued')),
                    ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                    ('hardware', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='stack_changes', to='catalog.hardware')),
                ],
                options={
                    'db_table': 'alerts_stackchange',
                    'ordering': ['-created_at', '-id'],
                },
            ),
        ]),
    ]
