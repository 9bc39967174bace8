"""The admin's concept filter: the concept tags most used among a list's latest rows, as filter choices."""

from collections import Counter

from django.contrib import admin

from ..text import concept_match

# Rows read to offer choices, and choices offered; `?concept=<tag>` filters by any tag, offered or not.
SAMPLE_ROWS = 500
CHOICES = 20


class ConceptFilter(admin.SimpleListFilter):
    title = "concept"
    parameter_name = "concept"

    def lookups(self, request, model_admin):
        counts = Counter()
        rows = model_admin.get_queryset(request).order_by("-pk").values_list("concepts", flat=True)[:SAMPLE_ROWS]
        for concepts in rows:
            counts.update(concepts.split())
        chosen = self.value()
        tags = [tag for tag, _ in counts.most_common(CHOICES)]
        if chosen and chosen not in tags:
            tags.append(chosen)
        return [(tag, tag) for tag in tags]

    def queryset(self, request, queryset):
        return queryset.filter(concept_match(self.value())) if self.value() else queryset
