from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0006_telegram_update_claims_reply_outbox"),
    ]

    operations = [
        migrations.AddField(
            model_name="reminder",
            name="thread_id",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
    ]
