"""Create the "operators" group (clusterapi.roles): members may issue commands and push configs."""

from django.db import migrations


def create_group(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Group.objects.get_or_create(name="operators")


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("clusterapi", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_group, migrations.RunPython.noop)]
