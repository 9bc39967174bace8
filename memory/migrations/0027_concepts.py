"""Concept tags of facts and episodes (memory.text.concept_tags), derived for the rows already there.

The columns are added with ALTER TABLE ... ADD COLUMN, not Django's AddField, which on SQLite would
rebuild memory_fact and memory_episode and drop the triggers of their indexes.
"""

from django.db import migrations, models

from memory.text import episode_concepts, fact_concepts


def derive(apps, schema_editor):
    """Concept tags of the rows written before there were any (later writes derive their own)."""
    Fact, Episode = apps.get_model("memory", "Fact"), apps.get_model("memory", "Episode")
    for model, fields, concepts in (
        (Fact, ("id", "key", "value"), lambda r: fact_concepts(r.key, r.value)),
        (Episode, ("id", "summary", "conversation"), lambda r: episode_concepts(r.summary, r.conversation)),
    ):
        batch = []
        for row in model.objects.only(*fields).iterator(chunk_size=2000):
            row.concepts = concepts(row)
            batch.append(row)
            if len(batch) == 2000:
                model.objects.bulk_update(batch, ["concepts"])
                batch = []
        model.objects.bulk_update(batch, ["concepts"])


ADD_COLUMNS = [
    "ALTER TABLE memory_fact ADD COLUMN concepts varchar(300) NOT NULL DEFAULT ''",
    "ALTER TABLE memory_episode ADD COLUMN concepts varchar(300) NOT NULL DEFAULT ''",
]
DROP_COLUMNS = [
    "ALTER TABLE memory_episode DROP COLUMN concepts",
    "ALTER TABLE memory_fact DROP COLUMN concepts",
]


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0026_episode_archive"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD_COLUMNS, DROP_COLUMNS)],
            state_operations=[
                migrations.AddField(
                    model_name="episode",
                    name="concepts",
                    field=models.CharField(blank=True, default="", max_length=300),
                ),
                migrations.AddField(
                    model_name="fact",
                    name="concepts",
                    field=models.CharField(blank=True, default="", editable=False, max_length=300),
                ),
            ],
        ),
        migrations.RunPython(derive, migrations.RunPython.noop),
    ]
