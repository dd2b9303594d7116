import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0002_invitations"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                help_text="The token whose request created this one: revoking it revokes this one.",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="minted",
                to="accounts.apitoken",
            ),
        ),
    ]
