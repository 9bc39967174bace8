"""The site's settings with a slow fake chat model, for servers that stream runs in tests."""

from config.settings import *  # noqa: F403

WORKFLOWS = {**WORKFLOWS, "CHAT_MODEL": {"class": "tests.slow_chat.SlowChat"}}  # noqa: F405
