"""DRF authentication by ``Authorization: Token <secret>`` (or ``Bearer <secret>``)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.models import ApiToken

# last_used_at is written at most this often per token, so hot paths (event ingest) do not write on every call.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def find_token(secret: str) -> tuple[ApiToken | None, str]:
    """The usable token with this secret, or None and why not (unknown or revoked, or its user inactive).
    The one token check of the API and of the WebSockets."""
    token = (
        ApiToken.objects.select_related("user", "organization", "hardware")
        .filter(key_hash=hash_secret(secret))
        .first()
    )
    if token is None or token.revoked_at is not None:
        return None, "invalid or revoked token"
    if not token.user.is_active:
        return None, "the token's user is inactive"
    return token, ""


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Looks the token up by the hash of its secret; revoked tokens and inactive users are refused."""

    keywords = ("token", "bearer")

    def authenticate(self, request: Request) -> tuple | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Token <secret>'")
        try:
            secret = header[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("token is not valid UTF-8") from exc
        token, problem = find_token(secret)
        if token is None:
            raise exceptions.AuthenticationFailed(problem)
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return "Token"
