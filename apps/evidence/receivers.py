"""Evidence follows the facts its verdicts were judged with (``apps.core.events``, inside the writer's
transaction): a release or hardware whose judged facts changed has its stored results judged again
(``rejudge.rejudge_results``), and a release whose reference arrived has its challenged results judged again
against it. Connected in ``EvidenceConfig.ready``, which also adds the weight challenge to
every task payload (``jobs.dispatch.add_payload_part``) and its digest readers to the model API."""

from __future__ import annotations

from typing import Any

from apps.catalog.api.serializers import DIGEST_READERS
from apps.core import events
from apps.evidence import manifests, weights
from apps.evidence.rejudge import HARDWARE_JUDGED_FIELDS, MODEL_JUDGED_FIELDS, rejudge_release, rejudge_results
from apps.jobs import dispatch


def on_catalog_changed(*, model: Any = None, hardware: Any = None, created: bool = False, changed: Any = (),
                       **_: Any) -> None:
    if created:
        return  # nothing was judged with a new row
    if model is not None:
        judged = [name for name in MODEL_JUDGED_FIELDS if name in changed]
        if judged:
            rejudge_results(model=model, reason=f"model {model.slug} {', '.join(judged)} changed")
    if hardware is not None:
        judged = [name for name in HARDWARE_JUDGED_FIELDS if name in changed]
        if judged:
            rejudge_results(hardware=hardware, reason=f"hardware {hardware.slug} {', '.join(judged)} changed")


def on_reference_recorded(*, release_id: int, **_: Any) -> None:
    rejudge_release(release_id)


def connect() -> None:
    events.reference_recorded.connect(on_reference_recorded, dispatch_uid="evidence.reference_recorded")
    events.catalog_changed.connect(on_catalog_changed, dispatch_uid="evidence.catalog_changed")
    dispatch.add_payload_part(weights.payload_for)  # an attempt's weight challenge rides in its task payload
    DIGEST_READERS.update(digest_conflict=manifests.digest_disagreement,  # the model API shows them
                          hardware_digests=manifests.hardware_digests)
