# The stack models moved to the fleet app (fleet 0003): state only, their tables stay as they are.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveField(
                model_name='hardwarestack',
                name='hardware',
            ),
            migrations.RemoveField(
                model_name='stackchange',
                name='hardware',
            ),
            migrations.DeleteModel(
                name='HardwarePolicy',
            ),
            migrations.DeleteModel(
                name='HardwareStack',
            ),
            migrations.DeleteModel(
                name='StackChange',
            ),
        ]),
    ]
