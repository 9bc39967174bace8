"""Which rows of the tables without a workspace column belong to the current workspace: conditions
for memory.models.workspaces.scoped (promotions, the memory graph's edges). Fact versions have a
column of their own (migration 0031)."""

from django.db.models import Q

from ..models import Episode, Fact, Procedure, RecallKind


def promotions_of(workspace_id):
    """Promotions into the workspace's people, or from its facts and episodes."""
    return (
        Q(user__workspace_id=workspace_id)
        | Q(source_kind=RecallKind.FACT, source_id__in=Fact.objects.values("id"))
        | Q(source_kind=RecallKind.EPISODE, source_id__in=Episode.objects.values("id"))
    )


def documents_of(path):
    """Q: the recall document at `path` is of a fact, episode or procedure of the current workspace
    (the items' default managers hold the current workspace's rows)."""
    return (
        Q(**{f"{path}__kind": RecallKind.FACT, f"{path}__item_id__in": Fact.objects.values("id")})
        | Q(**{f"{path}__kind": RecallKind.EPISODE, f"{path}__item_id__in": Episode.objects.values("id")})
        | Q(**{f"{path}__kind": RecallKind.PROCEDURE, f"{path}__item_id__in": Procedure.objects.values("id")})
    )


def relations_of(workspace_id):
    """Edges of the memory graph that start at a memory of the workspace."""
    return documents_of("source")
