"""Episode vectors are embedded again: the model now reads an episode's recall document without its
leading date line (memory.embeddings.without_date_line; the keyword leg still matches the date).

Only vectors are cleared; the texts stay. The embedding worker embeds the pending documents when a
process starts (or `memory reindex --missing` does), and until then the keyword leg finds them.
Backwards the same: vectors are cleared and embedded again by the code of that time.
"""

from django.db import migrations

CLEAR = "UPDATE memory_recall_doc SET embedding = NULL WHERE kind = 'episode' AND embedding IS NOT NULL"


class Migration(migrations.Migration):
    dependencies = [("memory", "0019_episode_date_in_recall_text")]

    operations = [migrations.RunSQL(CLEAR, CLEAR)]
