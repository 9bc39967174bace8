"""The chat model of agent nodes, from WORKFLOWS["CHAT_MODEL"] (None: the offline responder)."""

import threading

from django.utils.module_loading import import_string

from ..conf import on_workflow_settings_changed, workflow_settings
from ..exceptions import ChatModelConfigError

_lock = threading.Lock()
_model = None
_loaded = False


def build_chat_model(spec):
    """A LangChain chat model from a spec: {"class", "kwargs"} or {"base_url", "api_key", "model"}; None for None."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ChatModelConfigError("CHAT_MODEL must be a dict or None")
    if "class" in spec:
        try:
            cls = import_string(spec["class"])
        except ImportError as exc:
            raise ChatModelConfigError(f"CHAT_MODEL.class: cannot import {spec['class']!r} ({exc})") from None
        kwargs = spec.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ChatModelConfigError("CHAT_MODEL.kwargs must be a dict")
        return cls(**kwargs)
    if "base_url" in spec or "model" in spec:
        try:
            from langchain_openai import ChatOpenAI
        except ImportError:
            raise ChatModelConfigError(
                "CHAT_MODEL.base_url needs langchain-openai: pip install langchain-openai"
            ) from None
        if not spec.get("model"):
            raise ChatModelConfigError("CHAT_MODEL.model is required with base_url")
        return ChatOpenAI(
            base_url=spec.get("base_url") or None,
            api_key=spec.get("api_key") or "none",
            model=spec["model"],
            **(spec.get("kwargs") or {}),
        )
    raise ChatModelConfigError("CHAT_MODEL needs 'class' (an import string) or 'base_url' and 'model'")


def get_chat_model():
    """The configured chat model, built once per process (None when none is configured)."""
    global _model, _loaded
    if not _loaded:
        with _lock:
            if not _loaded:
                _model = build_chat_model(workflow_settings.CHAT_MODEL)
                _loaded = True
    return _model


def reset_chat_model():
    global _model, _loaded
    with _lock:
        _model, _loaded = None, False


on_workflow_settings_changed(reset_chat_model)
