"""The documents a reader relies on: the README's quick start runs as written, its links lead to pages
that exist, and the settings reference names every setting Engram reads, once."""

import re
from pathlib import Path

import pytest

from memory.conf import DEFAULTS as MEMORY_DEFAULTS
from memory.models import Fact
from workflows.conf import DEFAULTS as WORKFLOWS_DEFAULTS

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SETTINGS_PAGE = REPO / "docs" / "reference" / "settings.md"


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert first_block.startswith("scripts/serve.sh")
    assert "\nscripts/test.sh" in first_block


def test_every_link_of_the_readme_into_the_repository_exists():
    targets = re.findall(r"\]\(((?!https?:)[^)#\s]+)", README.read_text())
    assert targets, "the README links to the docs"
    missing = [target for target in targets if not (REPO / target).exists()]
    assert missing == []


@pytest.mark.django_db
def test_the_readme_quick_start_runs_as_written(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 30
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102  (the documented example, verbatim)
    fact = Fact.objects.get(key="favourite_colour")
    assert (fact.value, fact.scope) == ("green", "user")
    assert "favourite_colour: green" in capsys.readouterr().out


def _documented_settings():
    """{table: [keys]} of the settings page: a table is named by its header's first cell, e.g.
    `MEMORY[...]` or `MEMORY["LIMITS"][...]`; its rows' first cells name the keys."""
    tables, current = {}, None
    for line in SETTINGS_PAGE.read_text().splitlines():
        if not line.startswith("|"):
            current = None
            continue
        first = line.split("|")[1].strip()
        if current is None:
            current = first.strip("`")
            tables.setdefault(current, [])
        elif not first.startswith("---"):
            tables[current] += re.findall(r"`([A-Z_]+)`", first)
    return tables


def _expected_settings(app, defaults):
    expected = {f"{app}[...]": []}
    for key, default in defaults.items():
        # A dict of settings (upper-case keys, as LIMITS) has a table of its own; a dict that is a value
        # (a mapping of the user's own names, as STORE_NAMESPACES) is one row.
        if isinstance(default, dict) and default and all(name.isupper() for name in default):
            expected[f'{app}["{key}"][...]'] = list(default)
        else:
            expected[f"{app}[...]"].append(key)
    return expected


def test_the_settings_reference_documents_every_setting_once():
    documented = _documented_settings()
    expected = {**_expected_settings("MEMORY", MEMORY_DEFAULTS), **_expected_settings("WORKFLOWS", WORKFLOWS_DEFAULTS)}
    # Several tables may share a name (MEMORY[...] is split by topic): their rows add up.
    assert {name: sorted(keys) for name, keys in documented.items()} == {
        name: sorted(keys) for name, keys in expected.items()
    }


def test_the_command_line_reference_names_every_command_and_subcommand():
    from django.core.management import get_commands, load_command_class

    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    ours = sorted(name for name, app in get_commands().items() if app in ("memory", "workflows"))
    assert "memory" in ours
    assert [name for name in ours if f"`{name}" not in page and f"manage.py {name}" not in page] == []
    parser = load_command_class("memory", "memory").create_parser("manage.py", "memory")
    # The help lists each subcommand under "positional arguments", indented by four spaces.
    subcommands = re.findall(r"^    ([a-z][a-z-]*)\b", parser.format_help(), re.M)
    assert len(subcommands) > 10
    assert [name for name in subcommands if f"manage.py memory {name}" not in page] == []
