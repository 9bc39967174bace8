"""House rules of the memory app that import-linter cannot see: concerns are composed, not mixed in,
and no module reaches into another's private names (a leading underscore means "this module's own")."""

import ast
import inspect
from pathlib import Path

import pytest
from django.utils import timezone

import memory
from memory.models import Fact, RecallDocument, Scope
from memory.models.owners import agent_suffix, fact_owner_key, owner_key
from memory.service import MemoryService

MEMORY = Path(memory.__file__).parent
# The code of the memory app, outside its migrations (frozen history) and the edges' templates.
MODULES = sorted(p for p in MEMORY.rglob("*.py") if "migrations" not in p.parts)


def module_name(path):
    return ".".join(path.relative_to(MEMORY.parent).with_suffix("").parts).removesuffix(".__init__")


def imported_memory_modules(tree, module, is_package):
    """{local name: module} of the memory modules `module` imports as modules (import x / from . import x)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                if (MEMORY.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    MEMORY.parent / Path(*candidate.split(".")) / "__init__.py"
                ).exists():
                    names[alias.asname or alias.name] = candidate
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("memory."):
                    names[alias.asname or alias.name.split(".")[0]] = alias.name
    return names


def collaborators(tree):
    """Attributes a class's __init__ sets from its parameters: `self.users = users`."""
    held = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            params = {a.arg for a in node.args.args[1:]}
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id in params:
                    for target in stmt.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                            held.add(target.attr)
    return held


def is_private(name):
    return name.startswith("_") and not name.startswith("__")


def private_reaches(source, module, is_package=False):
    """Where `module` uses a private name of another memory module or of a collaborator it was given."""
    tree = ast.parse(source)
    modules = imported_memory_modules(tree, module, is_package)
    held = collaborators(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("memory")):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if is_private(a.name)]
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in modules:
                found.append(f"line {node.lineno}: {owner.id}.{node.attr}")
            if (
                isinstance(owner, ast.Attribute)
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "self"
                and owner.attr in held
            ):
                found.append(f"line {node.lineno}: self.{owner.attr}.{node.attr}")
    found += foreign_self_names(tree)
    return found


def foreign_self_names(tree):
    """`self._x` in a class of its own (no bases) that defines no `_x`: a private name reached through
    `self` that only another class has (what mixins did)."""
    found = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef) or cls.bases:
            continue
        defined = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        defined |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        uses = [n for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)]
        defined |= {n.attr for n in uses if n.value.id == "self" and isinstance(n.ctx, ast.Store)}
        for node in uses:
            if node.value.id == "self" and is_private(node.attr) and node.attr not in defined:
                found.append(f"line {node.lineno}: self.{node.attr}, which {cls.name} does not define")
    return found


def test_no_memory_module_uses_a_private_name_of_another_module_or_collaborator():
    reaches = {
        module_name(path): private_reaches(path.read_text(), module_name(path), path.name == "__init__.py")
        for path in MODULES
    }
    assert {name: where for name, where in reaches.items() if where} == {}


def test_the_rule_sees_each_kind_of_reach():
    # The check itself: a private import, a module's private name, a collaborator's private method.
    sample = (
        "from . import facts\n"
        "from .facts import _hidden\n\n\n"
        "class Sample:\n"
        "    def __init__(self, users):\n"
        "        self.users = users\n\n"
        "    def go(self):\n"
        "        self._own()\n"
        "        facts._helper()\n"
        "        return self.users._user_by_id(1) or self._follow()\n\n"
        "    def _own(self):\n"
        "        return 1\n"
    )
    assert private_reaches(sample, "memory.domain.sample") == [
        "line 2: imports _hidden",
        "line 11: facts._helper",
        "line 12: self.users._user_by_id",
        "line 12: self._follow, which Sample does not define",
    ]


def test_memory_service_is_composed_not_mixed_in():
    assert MemoryService.__bases__ == (object,)
    service = MemoryService.__new__(MemoryService)
    MemoryService.__init__(service)
    concerns = {name: type(value).__name__ for name, value in vars(service).items() if name != "backend"}
    assert concerns == {
        "users": "Users",
        "recall_index": "RecallIndex",
        "facts": "Facts",
        "episodes": "Episodes",
        "procedures": "Procedures",
        "store_items": "StoreItems",
        "operators": "Operators",
        "recalls": "Recall",
        "lifecycle": "Lifecycle",
        "curation": "Curation",
        "teams": "Teams",
    }
    # Each public method is handed on with the concern's signature.
    assert inspect.signature(MemoryService.set_fact) == inspect.signature(type(service.facts).set_fact)


@pytest.mark.django_db
def test_the_database_spells_owner_keys_as_their_one_definition(service, user_factory):
    # Fact.scope_key is generated by the database and recall documents' owners by the triggers of
    # migration 0006 (frozen SQL): both must say what memory/models/owners.py says.
    ada = user_factory("ada")
    owners = {Scope.GLOBAL: {}, Scope.AGENT: {"agent_id": "bot"}, Scope.USER: {"user_id": ada.pk}}
    owners[Scope.SESSION] = {"session_id": "s1"}
    for scope, columns in owners.items():
        fact = Fact.objects.get(pk=service.set_fact(f"k-{scope}", "v", scope=scope, **columns).fact.pk)
        assert fact.scope_key == fact_owner_key(fact) == owner_key(scope, **columns)
        assert RecallDocument.objects.get(kind="fact", item_id=fact.pk).owner == fact.scope_key
    episode = service.record_episode(started_at=timezone.now(), agent_id="bot", user_id=ada.pk, success=True)
    owner = RecallDocument.objects.get(kind="episode", item_id=episode.pk).owner
    assert owner == owner_key(Scope.USER, user_id=ada.pk) + agent_suffix("bot")


REPO = MEMORY.parent
MAX_MODULE_LINES = 600
MAX_MODULES_PER_PACKAGE = 15


def _committed_code():
    """The repository's Python modules outside tests and migrations (frozen history), and outside
    virtualenvs and the builder's node_modules."""
    skipped = {"tests", "migrations", "node_modules", "site-packages"}
    return [p for p in REPO.rglob("*.py") if not skipped & set(p.relative_to(REPO).parts) and ".venv" not in str(p)]


def test_no_module_is_over_600_lines_and_no_package_holds_more_than_15():
    modules = _committed_code()
    too_long = {
        str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}
    per_folder = {}
    for p in modules:
        per_folder.setdefault(p.parent, []).append(p)
    crowded = {
        str(folder.relative_to(REPO)): len(found)
        for folder, found in per_folder.items()
        if (folder / "__init__.py").exists() and len(found) > MAX_MODULES_PER_PACKAGE
    }
    assert crowded == {}
