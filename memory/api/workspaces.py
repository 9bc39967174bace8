"""The workspace of a request: resolved once, from the API token (in the token's own lookup) or from
the staff session, and current (memory.models.workspaces) until the response is made."""

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import SessionAuthentication, TokenAuthentication

from ..models.workspaces import enter_workspace, leave_workspace, workspace_of_user


class WorkspaceMiddleware:
    """Brackets every request: no workspace is current when it starts, and none leaks out of it.

    Authentication (below, and the admin site) makes the user's workspace current; a thread that
    serves the next request starts unscoped again.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = enter_workspace(None)
        try:
            return self.get_response(request)
        finally:
            leave_workspace(token)


def enter_workspace_of(user):
    """Make the workspace of `user` (an authenticated staff account) current for this request."""
    enter_workspace(workspace_of_user(user))


def enter_workspace_of_staff(request):
    """For the plain Django views outside the API (/healthz, /metrics): the staff account of the
    request's API token (`Authorization: Token <key>`) or admin session, whose workspace is made
    current (as the API does: no membership, the default workspace); None, and nothing current,
    for anyone else. An unknown or inactive token raises AuthenticationFailed."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "token" and key.strip():
        user, _ = WorkspaceTokenAuthentication().authenticate_credentials(key.strip())
    else:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
    if not user.is_staff:
        enter_workspace(None)
        return None
    enter_workspace_of(user)
    return user


class WorkspaceTokenAuthentication(TokenAuthentication):
    """DRF's token authentication; the token's user comes with their workspace membership in the same
    query, and that workspace becomes current."""

    def authenticate_credentials(self, key):
        model = self.get_model()
        try:
            token = model.objects.select_related("user__engram_workspace").get(key=key)
        except model.DoesNotExist:
            raise exceptions.AuthenticationFailed(_("Invalid token.")) from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        enter_workspace_of(token.user)
        return token.user, token


class WorkspaceSessionAuthentication(SessionAuthentication):
    """DRF's session authentication (the admin's login, with its CSRF check); the user's workspace becomes current."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is not None:
            enter_workspace_of(result[0])
        return result


class WorkspaceModelBackend(ModelBackend):
    """Django's ModelBackend, whose session user comes with their workspace membership in the same
    query (AUTHENTICATION_BACKENDS): the admin and the API's session requests cost no extra query."""

    def get_user(self, user_id):
        model = get_user_model()
        try:
            user = model._default_manager.select_related("engram_workspace").get(pk=user_id)
        except model.DoesNotExist:
            return None
        return user if self.user_can_authenticate(user) else None
