"""A LangChain fake chat model that takes its time: the stream tests see events arrive while it thinks."""

from langchain_core.language_models.fake_chat_models import FakeListChatModel


class SlowChat(FakeListChatModel):
    """FakeListChatModel (its `sleep` before each answer) that accepts tools and never calls them."""

    responses: list[str] = ["Hello from the slow model."]
    sleep: float | None = 1.0

    def bind_tools(self, tools, **kwargs):
        return self
