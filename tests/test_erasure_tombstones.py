"""Tombstones: an export from before a forget does not bring the forgotten person back unasked."""

import io

import pytest
from django.core.management import CommandError, call_command

from memory.exceptions import ImportRejected
from memory.models import ChannelIdentity, Fact, MemoryUser, Tombstone

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "Łucja Wąsowska"


@pytest.fixture
def export_then_forget(service, tmp_path):
    """Ada (kept) and Łucja (forgotten after the export, with a merged alias); the export's path."""
    ada, _ = service.get_or_create_user("telegram", "111", display_name="Ada")
    service.set_fact("city", "Oslo", scope="user", user_id=ada.pk)
    person, _ = service.get_or_create_user("telegram", "918273645", display_name=NAME)
    alias, _ = service.get_or_create_user("email", "lucja.w@example.org", display_name=NAME)
    service.set_fact("pin", "zq-pin-7731", scope="user", user_id=person.pk)
    service.merge_users(alias.pk, person.pk)
    path = tmp_path / "before.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        service.export_memories(out)
    service.delete_users([person.pk], cascade=True)
    return {"path": path, "person": person.pk, "alias": alias.pk, "ada": ada.pk}


def test_a_tombstone_keeps_ids_and_hashes_never_names(export_then_forget):
    stones = list(Tombstone.objects.values_list("forgotten_id", "digest"))
    assert {pk for pk, _ in stones} == {export_then_forget["person"], export_then_forget["alias"]}
    text = repr(stones).lower()
    for needle in ("łucja", "918273645", "lucja.w@example.org", "telegram"):
        assert needle not in text


def test_an_import_refuses_a_forgotten_person_naming_the_lines(export_then_forget, service):
    with open(export_then_forget["path"], encoding="utf-8") as stream:
        with pytest.raises(ImportRejected) as refused:
            service.import_memories(stream)
    fields = {field for _line, field, _message in refused.value.errors}
    assert {"id", "external_id"} <= fields
    assert all("forgotten" in message and "--allow-forgotten" in message for *_, message in refused.value.errors)
    assert not MemoryUser.objects.filter(display_name=NAME).exists()  # nothing written, Ada's rows included
    assert not Fact.objects.filter(key="pin").exists()


def test_the_import_command_refuses_and_allow_forgotten_brings_them_back(export_then_forget):
    path = str(export_then_forget["path"])
    with pytest.raises(CommandError, match="forgotten"):
        call_command("memory", "import", path, stdout=io.StringIO())
    assert not ChannelIdentity.objects.filter(external_id="918273645").exists()
    call_command("memory", "import", path, "--allow-forgotten", stdout=io.StringIO())
    assert MemoryUser.objects.filter(pk=export_then_forget["person"], display_name=NAME).exists()
    assert Fact.objects.filter(key="pin", user_id=export_then_forget["person"]).exists()


def test_an_export_without_the_forgotten_person_imports_as_before(service, export_then_forget, tmp_path):
    path = tmp_path / "after.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        service.export_memories(out)
    service.delete_users([export_then_forget["ada"]], cascade=True)
    # Ada is forgotten too now; the later export holds her, so it is refused for her alone.
    with open(path, encoding="utf-8") as stream, pytest.raises(ImportRejected) as refused:
        service.import_memories(stream)
    assert {line for line, *_ in refused.value.errors} == {2, 3}  # her user and identity lines
