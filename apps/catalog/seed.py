"""Loads the bundled catalog (``contract/data``: real public model configs and accelerator specs) into
the database. Idempotent: rows are matched by slug and updated when the data changed."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from apps.accounts.choices import Role
from apps.accounts.models import Membership, Organization
from apps.catalog import services
from apps.catalog.engines import ensure_builtin_engines
from apps.catalog.models import Hardware, ModelRelease

DEMO_ORG_SLUG = "day0-demo"


@dataclass
class SeedSummary:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def _release_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, str) and len(value) == 10:
        return datetime.combine(date.fromisoformat(value), datetime.min.time(), tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _organization(name: str) -> Organization:
    org, _ = Organization.objects.get_or_create(slug=slugify(name)[:64] or "unknown", defaults={"name": name})
    return org


def _upsert(existing: Any, fields: dict[str, Any], create: Any, update: Any, label: str, summary: SeedSummary) -> None:
    if existing is None:
        create(**fields)
        summary.created.append(label)
        return
    changed = {k: v for k, v in fields.items() if getattr(existing, k) != v}
    if changed:
        update(existing, **changed)
        summary.updated.append(label)
    else:
        summary.unchanged.append(label)


@transaction.atomic
def seed_catalog(*, include_cpu: bool = True) -> SeedSummary:
    """Hardware from ``hardware.json`` (plus this host as ``cpu``), then models from ``models.json``."""
    from contract.hardware import cpu_hardware, load_catalog, load_model_catalog

    summary = SeedSummary()
    summary.created += [f"engine:{ref}" for ref in ensure_builtin_engines()]
    specs = list(load_catalog().values()) + ([cpu_hardware()] if include_cpu else [])
    for spec in specs:
        row = spec.to_dict()
        fields = {name: row.get(name) for name in services.HARDWARE_FIELDS if name in row}
        fields["operator_manifest"] = fields.get("operator_manifest") or []
        fields["notes"] = fields.get("notes") or ""
        _upsert(Hardware.objects.filter(slug=spec.slug).first(), fields, services.do_create_hardware,
                services.do_update_hardware, f"hardware:{spec.slug}", summary)
    if include_cpu:
        # this host runs transformers in fp32: staff's reference hardware, whose reference runs hold the references
        Hardware.objects.filter(slug=cpu_hardware().slug, organization__isnull=True).update(reference=True)
    for entry in load_model_catalog():
        fields = {
            "slug": entry["slug"], "name": entry["name"], "hf_repo": entry.get("hf_repo") or "",
            "organization": _organization(entry.get("publisher") or "unknown"),
            "released_at": _release_time(entry.get("released_at")), "config": entry["config"],
            "modalities": entry.get("modalities") or ["text"],
            "published_params_total": entry.get("published_params_total"),
            "published_params_active": entry.get("published_params_active"),
        }
        _upsert(ModelRelease.objects.filter(slug=entry["slug"]).first(), fields, services.do_create_model_release,
                services.do_update_model_release, f"model:{entry['slug']}", summary)
    return summary


@transaction.atomic
def ensure_demo_admin(username: str = "admin", password: str | None = None) -> tuple[Any, str | None]:
    """A superuser who administers the demo organization. Returns (user, password) — the password only when
    this call set it (a new user, or ``password`` given)."""
    org, _ = Organization.objects.get_or_create(slug=DEMO_ORG_SLUG, defaults={"name": "Day-0 demo"})
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first()
    new_password = None
    if user is None:
        new_password = password or secrets.token_urlsafe(12)
        user = user_model.objects.create_superuser(username=username, email=f"{username}@localhost",
                                                   password=new_password)
    elif password:
        user.set_password(password)
        user.save(update_fields=["password"])
        new_password = password
    Membership.objects.update_or_create(organization=org, user=user, defaults={"role": Role.ADMIN})
    return user, new_password
