"""Channel-layer messages about tokens: a revoked token's open WebSockets are told to close."""

from __future__ import annotations

from typing import Literal, TypedDict

from apps.core.broadcast import group_send


class TokenRevokedMessage(TypedDict):
    type: Literal["token.revoked"]
    token: int


def token_group(token_id: int) -> str:
    """The group every WebSocket opened with this token joins."""
    return f"token.{token_id}"


def broadcast_token_revoked(token_id: int) -> None:
    message: TokenRevokedMessage = {"type": "token.revoked", "token": token_id}
    group_send(token_group(token_id), dict(message))
