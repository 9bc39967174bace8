"""MkDocs hook: the node types reference is generated from the registry, as the API serves it.

The table is built when the site is built, from what `GET /api/v1/node-types/` answers (the same view,
called in-process), so a node type added, renamed or given a new config key shows up in the docs
without anyone editing them.
"""

import json
import os
import sys
from pathlib import Path

MARKER = "<!-- node-types -->"
ROOT = Path(__file__).resolve().parents[2]


def _node_types():
    sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.urls import resolve
    from rest_framework.test import APIRequestFactory, force_authenticate

    # The served list, through its URL: the docs follow the API wherever the registry lives.
    path = "/api/v1/node-types/"
    request = APIRequestFactory().get(path)
    force_authenticate(request, user=User(username="docs", is_staff=True, is_active=True))
    response = resolve(path).func(request)
    response.render()
    return json.loads(response.content)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _config_rows(schema):
    properties = schema.get("properties") or {}
    if not properties:
        return "—"
    parts = []
    for name, spec in properties.items():
        kind = spec.get("type", "")
        if isinstance(kind, list):
            kind = "/".join(kind)
        default = f", default `{json.dumps(spec['default'])}`" if "default" in spec else ""
        parts.append(f"`{name}` ({kind}{default})" if kind else f"`{name}`{default}")
    return "<br>".join(parts)


def render_table(types):
    lines = ["| node type | category | does | config | reads | writes |", "|---|---|---|---|---|---|"]
    for t in types:
        lines.append(
            "| `{name}` | {category} | {description} | {config} | {inputs} | {outputs} |".format(
                name=t["name"],
                category=_cell(t["category"]),
                description=_cell(t["description"]),
                config=_cell(_config_rows(t["config_schema"])),
                inputs=", ".join(f"`{i}`" for i in t["inputs"]) or "—",
                outputs=", ".join(f"`{o}`" for o in t["outputs"]) or "—",
            )
        )
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_table(_node_types()))
