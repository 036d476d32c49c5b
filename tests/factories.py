"""factory_boy factories for portal rows. Models go through the catalog service (derived fields computed from
the config, matrix cells created); tokens come with their one-time ``secret`` attribute."""

from __future__ import annotations

import copy
import secrets
from datetime import UTC, datetime
from typing import Any

import factory
from django.contrib.auth import get_user_model

from apps.accounts.choices import Role, Scope
from apps.accounts.models import Membership, Organization
from apps.accounts.services import do_create_api_token
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.services import do_create_hardware, do_create_model_release
from apps.jobs.choices import JobState
from apps.jobs.models import Job

# A small but real Llama-style config.json (GQA): the planner and parameter counter read it like any other.
TINY_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tiny_config(**overrides: Any) -> dict[str, Any]:
    config = copy.deepcopy(TINY_LLAMA_CONFIG)
    config.update(overrides)
    return config


class OrganizationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organization
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"org-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "pw-123456")

    @factory.post_generation
    def save_password(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        if create:
            self.save()


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    organization = factory.SubFactory(OrganizationFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.VIEWER


class HardwareFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Hardware

    slug = factory.Sequence(lambda n: f"accel-{n}")
    organization = None  # a shared catalog entry; pass an organization for owned hardware
    vendor = "Acme"
    name = factory.LazyAttribute(lambda h: f"Acme {h.slug}")
    memory_bytes = 80 * 10**9
    devices_per_node = 8
    intra_node_gbps = 900.0
    inter_node_gbps = 50.0
    memory_bandwidth_gbps = 3350.0
    dtypes = factory.LazyFunction(lambda: ["float32", "bfloat16", "float16"])
    peak_tflops = factory.LazyFunction(lambda: {"bfloat16": 989.0})
    operator_manifest = factory.LazyFunction(list)

    @classmethod
    def _create(cls, model_class: type, *args: Any, **kwargs: Any) -> Hardware:
        return do_create_hardware(**kwargs)


class ModelReleaseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ModelRelease

    slug = factory.Sequence(lambda n: f"model-{n}.1b")
    name = factory.LazyAttribute(lambda m: m.slug.title())
    organization = factory.SubFactory(OrganizationFactory)
    released_at = factory.LazyFunction(lambda: datetime(2025, 1, 1, tzinfo=UTC))
    config = factory.LazyFunction(tiny_config)
    visibility = "public"
    modalities = factory.LazyFunction(lambda: ["text"])

    @classmethod
    def _create(cls, model_class: type, *args: Any, **kwargs: Any) -> ModelRelease:
        return do_create_model_release(**kwargs)


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    model = factory.SubFactory(ModelReleaseFactory)
    hardware = factory.SubFactory(HardwareFactory)
    organization = factory.LazyAttribute(lambda j: j.model.organization)
    spec = factory.LazyFunction(lambda: {"stages": ["plan", "load", "inventory", "align", "serve", "bench", "env",
                                                    "eval"], "dtype": "bfloat16"})
    state = JobState.RUNNING
    # past its first dispatch (unless still queued): results bind to this attempt and its nonce
    attempts = factory.LazyAttribute(lambda j: 0 if j.state == JobState.QUEUED else 1)
    nonce = factory.LazyAttribute(lambda j: "" if j.state == JobState.QUEUED else secrets.token_hex(16))


def make_token(*, organization: Organization, user: Any = None, scopes: list[str] | None = None,
               hardware: Hardware | None = None, role: str = Role.SUBMITTER, name: str = "test") -> Any:
    """A token of a member of ``organization`` (created with ``role`` when ``user`` is None); ``.secret`` is set."""
    if user is None:
        user = UserFactory()
        Membership.objects.create(organization=organization, user=user, role=role)
    token, secret = do_create_api_token(organization=organization, user=user, name=name,
                                        scopes=scopes or [Scope.READ, Scope.SUBMIT],
                                        hardware_id=hardware.pk if hardware else None)
    token.secret = secret
    return token


def auth(token: Any) -> dict[str, str]:
    """Request headers for ``token`` (for ``APIClient`` calls: ``client.get(url, **auth(token))``)."""
    return {"HTTP_AUTHORIZATION": f"Token {token.secret}"}
