"""Bulk actions of the /memories/ admin: delete the selected rows, merge the selected users.

Both show a confirmation page first; the work itself is one MemoryService call in one transaction.
"""

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import transaction
from django.template.response import TemplateResponse

from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import Episode, Fact, Procedure, StoreItem
from ..service import MemoryService

CONFIRM_SAMPLE = 20


@admin.action(description="Delete selected")
def owner_label(obj):
    """Whose memory a row is, for people: the person's name (or canonical id), the agent, the session."""
    user = getattr(obj, "user", None) if getattr(obj, "user_id", None) else None
    person = (user.display_name or user.canonical_id) if user is not None else ""
    agent = f"agent {obj.agent_id}" if getattr(obj, "agent_id", "") else ""
    if isinstance(obj, Fact):
        if obj.scope == "team":
            return f"team {obj.team.name}"
        return {"user": person, "agent": agent, "session": f"session {obj.session_id}"}.get(obj.scope, "everyone")
    if isinstance(obj, Procedure):
        return agent or "every agent"
    if isinstance(obj, StoreItem):
        return person or agent or "everyone"
    parts = [p for p in (person, agent) if p] or ([f"session {obj.session_id}"] if obj.session_id else ["nobody"])
    return " with ".join(parts)


def confirmation_label(obj):
    """A row as a delete confirmation names it: facts, episodes and procedures with whose they are."""
    if isinstance(obj, (Fact, Episode, Procedure)):
        return f"{obj} — {owner_label(obj)}"
    return str(obj)


def _related(modeladmin):
    """What the sample's labels read (a fact's or episode's person) in the same query."""
    return [f for f in getattr(modeladmin, "list_select_related", None) or [] if isinstance(f, str)]


def delete_memories(modeladmin, request, queryset):
    """Delete every selected row (all pages with "select all") after a confirmation page."""
    opts = modeladmin.model._meta
    ids = list(queryset.order_by().values_list("pk", flat=True))
    if request.POST.get("post") == "yes":
        result = modeladmin.delete_memories(ids, actor=f"admin:{request.user.get_username()}")
        text = f"Deleted {result.deleted} {opts.verbose_name if result.deleted == 1 else opts.verbose_name_plural}."
        if result.cascaded:
            also = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in result.cascaded.items() if n)
            if also:
                text += f" Also deleted: {also}."
        if result.not_found:
            text += f" {len(result.not_found)} were already gone."
        modeladmin.message_user(request, text, messages.SUCCESS)
        erasure = getattr(result, "erasure", None)
        if erasure is not None and not erasure.complete:
            modeladmin.message_user(
                request, "Erasure not complete: " + "; ".join(erasure.problems or ["pending"]), messages.WARNING
            )
        return None  # back to the change list
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"Delete {len(ids)} {opts.verbose_name_plural}?",
        "opts": opts,
        "count": len(ids),
        "sample": [confirmation_label(o) for o in queryset.select_related(*_related(modeladmin))[:CONFIRM_SAMPLE]],
        "more": max(0, len(ids) - CONFIRM_SAMPLE),
        "summary": modeladmin.delete_summary(ids),
        # With "select all", the rows are found again from the filters in the URL; Django still wants
        # the rows ticked on the page, so those are posted back either way.
        "ids": ids if request.POST.get("select_across") != "1" else request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "action_name": "delete_memories",
    }
    return TemplateResponse(request, "admin/memories/delete_confirmation.html", context)


@admin.action(description="Merge selected users")
def merge_users(modeladmin, request, queryset):
    """Merge the selected memory users into the one the operator picks on the next page."""
    users = list(queryset.order_by("pk"))
    if len(users) < 2:
        modeladmin.message_user(request, "Select at least two users to merge.", messages.WARNING)
        return None
    error = None
    if request.POST.get("post") == "yes":
        service = MemoryService()
        try:
            target_id = int(request.POST.get("target", ""))
            if target_id not in {u.pk for u in users}:
                raise InvalidMemoryArgument("target", "pick one of the selected users")
            target = None
            with transaction.atomic():  # every merge or none
                for user in users:
                    if user.pk != target_id:
                        target = service.merge_users(user.pk, target_id)
        except (InvalidMemoryArgument, MemoryNotFound) as exc:  # before ValueError: a subclass of it
            error = str(exc)
        except ValueError:
            error = "target: pick the user who remains"
        else:
            modeladmin.message_user(request, f"Merged {len(users) - 1} users into {target}.", messages.SUCCESS)
            return None
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"Merge {len(users)} users",
        "opts": modeladmin.model._meta,
        "users": users,
        "error": error,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "action_name": "merge_users",
    }
    return TemplateResponse(request, "admin/memories/merge_users.html", context)


def _pin(modeladmin, request, queryset, pinned):
    kind = modeladmin.model._meta.model_name
    ids = list(queryset.order_by().values_list("pk", flat=True))
    changed, _ = MemoryService().pin_memories(kind, ids, pinned=pinned)
    message = "Pinned" if pinned else "Unpinned"
    for obj in modeladmin.model.objects.filter(pk__in=changed):  # each change in the admin log, as an edit is
        modeladmin.log_change(request, obj, message)
    what = modeladmin.model._meta.verbose_name if len(changed) == 1 else modeladmin.model._meta.verbose_name_plural
    modeladmin.message_user(request, f"{message} {len(changed)} {what}.", messages.SUCCESS)


@admin.action(description="Pin selected (always in the prompt)")
def pin_memories(modeladmin, request, queryset):
    """Pin the selected facts or procedures: they reach every prompt of those who see them."""
    _pin(modeladmin, request, queryset, True)


@admin.action(description="Unpin selected")
def unpin_memories(modeladmin, request, queryset):
    _pin(modeladmin, request, queryset, False)
