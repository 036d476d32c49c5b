"""``manage.py create_token``: an API token for operators (agent tokens for new hosts, CI tokens); the secret
is printed once. The token is created as ``--user`` would create it through the API
(``accounts.services.check_create_api_token``): scopes within the user's role, and an agent token only for
hardware the user may mint it for (an admin of its owning organization, or staff; staff only for a shared entry)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.access import actor_of
from apps.accounts.models import Membership, Organization
from apps.accounts.services import check_create_api_token, hardware_rows


class Command(BaseCommand):
    help = "Create an API token and print its secret (shown once)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--user", required=True, help="username the token acts as (a member of --org)")
        parser.add_argument("--org", required=True, help="organization slug")
        parser.add_argument("--scopes", default="read", help="comma-separated: read, submit, agent")
        parser.add_argument("--hardware", default=None, help="hardware slug (agent tokens)")
        parser.add_argument("--name", default="cli")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        org = Organization.objects.filter(slug=options["org"]).first()
        if user is None:
            raise CommandError(f"no user {options['user']!r}")
        if org is None:
            raise CommandError(f"no organization {options['org']!r}")
        if not Membership.objects.filter(user=user, organization=org).exists():
            raise CommandError(f"{user.username} is not a member of {org.slug}")
        hardware = None
        if options["hardware"]:
            hardware = hardware_rows().filter(slug=options["hardware"]).first()
            if hardware is None:
                raise CommandError(f"no hardware {options['hardware']!r}")
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        try:
            token, secret = check_create_api_token(actor_of(user), organization=org, name=options["name"],
                                                   scopes=scopes, hardware=hardware)
        except PermissionDenied as exc:
            raise CommandError(f"refused for {user.username}: {exc}") from exc
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        self.stderr.write(f"token {token.prefix}… scopes {','.join(token.scopes)} (the secret is shown only now)")
        self.stdout.write(secret)
