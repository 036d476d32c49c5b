"""A small world of evidence for the dashboard tests, built through the factories and the seeding services:
two organizations, a public model with adaptation jobs on two hardware and a benchmark history with a planted
regression, and an embargoed model of another organization with evidence of its own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from apps.accounts.choices import Role
from apps.accounts.models import Membership, Organization
from apps.benchmarks.seeding import Clock, PlantedRegression, run_adaptation, seed_evidence, simulated_clock
from apps.catalog.models import Hardware, ModelRelease
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, UserFactory

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class World:
    public_org: Organization
    secret_org: Organization
    model: ModelRelease
    embargoed: ModelRelease
    hardware: Hardware
    other_hardware: Hardware
    regression: PlantedRegression
    viewer: object  # a member of public_org only
    insider: object  # a member of secret_org (sees the embargoed model)
    history_hardware: Hardware


def build_world(*, days: int = 30, regression_days_ago: int = 5) -> World:
    import random

    public_org = OrganizationFactory(slug="open-lab")
    secret_org = OrganizationFactory(slug="stealth-lab")
    h1 = HardwareFactory(slug="acc-a", vendor="Acme", name="Acme A100X", memory_bandwidth_gbps=3000.0)
    h2 = HardwareFactory(slug="acc-b", vendor="Bolt", name="Bolt B7", memory_bandwidth_gbps=1600.0)
    model = ModelReleaseFactory(slug="tiny-llama-1b", name="Tiny Llama 1B", organization=public_org,
                                released_at=NOW - timedelta(days=days + 20))
    embargoed = ModelReleaseFactory(slug="stealth-7b", name="Stealth 7B", organization=secret_org,
                                    visibility="private", released_at=NOW + timedelta(days=365 * 5))
    summary = seed_evidence(models=[model], hardware=[h1, h2], days=days, history_cells=1, hardware_per_model=2,
                            now=NOW, regression_days_ago=regression_days_ago, seed=3, outcomes=["validated", "align-fails"])
    with simulated_clock(NOW - timedelta(days=2)) as clock:
        run_adaptation(embargoed, h1, "baselined", clock, random.Random(1))
    assert summary.regression is not None, summary
    viewer, insider = UserFactory(username="viewer"), UserFactory(username="insider")
    Membership.objects.create(organization=public_org, user=viewer, role=Role.SUBMITTER)
    Membership.objects.create(organization=secret_org, user=insider, role=Role.SUBMITTER)
    history_hw = Hardware.objects.get(slug=summary.history[0][1])
    return World(public_org, secret_org, model, embargoed, h1, h2, summary.regression, viewer, insider, history_hw)


__all__ = ["Clock", "NOW", "World", "build_world"]
