"""Django project configuration for the Engram site."""

from importlib.util import find_spec

# The Celery app (config/celery.py), loaded with Django so that writers queue their tasks on it; the
# `cluster` extra installs Celery, and without it (or without a broker) nothing changes.
if find_spec("celery") is not None:
    from .celery import app as celery_app

    __all__ = ["celery_app"]
