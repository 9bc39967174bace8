"""WSGI entry point of the Engram site."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()

# A server runs workflows: the built-in node types (and LangGraph with them) are imported at start,
# not by the first request that needs them. A task worker, which builds no graph, never imports them.
from workflows.language.registry import node_types  # noqa: E402

node_types()
