"""The portal's REST API as the agent and the vendor CLI use it (``Authorization: Token <secret>``).

Agents hold no database credentials: everything they learn and report goes through these calls."""

from __future__ import annotations

import time
from typing import Any

import httpx

API_PREFIX = "/api/v1"


def describe_error(detail: Any, field: str = "") -> str:
    """The portal's error body as sentences: ``{"dtype": ["unknown …"], "bench": {"input_len": ["must …"]}}`` →
    ``dtype: unknown …; bench.input_len: must …`` (DRF's ``detail`` and ``non_field_errors`` need no name)."""
    if isinstance(detail, dict):
        parts = []
        for key, value in detail.items():
            name = field if key in ("detail", "non_field_errors") else f"{field}.{key}" if field else str(key)
            parts.append(describe_error(value, name))
        return "; ".join(p for p in parts if p)
    if isinstance(detail, list):
        return "; ".join(describe_error(item, field) for item in detail)
    text = str(detail).strip()
    return f"{field}: {text}" if field else text


class PortalError(Exception):
    """The portal answered with an error; ``status`` is the HTTP status and the message carries its detail."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"the portal answered {status}: {message}" if status else message)
        self.status = status


class PortalUnavailable(PortalError):
    """The portal could not be reached, or answered 5xx / 429: try again later."""


class PortalClient:
    """A small synchronous client of ``/api/v1/``; one instance per thread."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"portal URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self._http = httpx.Client(base_url=self.base_url + API_PREFIX, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PortalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None) -> Any:
        try:
            response = self._http.request(method, path, json=json, params=params)
        except httpx.HTTPError as exc:
            raise PortalUnavailable(0, f"the portal at {self.base_url} cannot be reached ({type(exc).__name__}: "
                                       f"{exc})") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise PortalUnavailable(response.status_code, response.text[:500])
        if response.status_code >= 400:
            try:
                detail = describe_error(response.json())
            except ValueError:
                detail = response.text[:500]
            raise PortalError(response.status_code, detail)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    # ------------------------------------------------------------------ agent calls

    def register_agent(self, *, hostname: str, capabilities: dict, versions: dict) -> dict:
        """Registers (idempotently on hardware and hostname) and returns the agent row; the hardware comes
        from the agent token."""
        return self.request("POST", "/agents/",
                            json={"hostname": hostname, "capabilities": capabilities, "versions": versions})

    def heartbeat(self, agent_id: int, *, current_job: int | None = None, versions: dict | None = None) -> dict:
        body: dict[str, Any] = {"current_job": current_job}
        if versions:  # the environment lock, when it is re-read: the portal compares it with the pool's stack
            body["versions"] = versions
        return self.request("POST", f"/agents/{agent_id}/heartbeat/", json=body)

    def get_job(self, job_id: int) -> dict:
        return self.request("GET", f"/jobs/{job_id}/")

    def post_events(self, job_id: int, events: list[dict[str, Any]]) -> int:
        """Posts one ordered batch; returns the highest contiguous seq the portal has stored."""
        answer = self.request("POST", f"/jobs/{job_id}/events/", json={"events": events})
        return int(answer["acked"])

    def post_result(self, job_id: int, stage: str, section: dict[str, Any],
                    binding: dict[str, Any] | None = None) -> Any:
        """Posts one stage's section bound to the attempt and nonce it was produced under (``binding``)."""
        return self.request("POST", f"/jobs/{job_id}/results/",
                            json={"stage": stage, "section": section, **(binding or {})})

    def post_report(self, job_id: int, report: dict[str, Any]) -> Any:
        return self.request("POST", f"/jobs/{job_id}/results/", json=report)

    def set_job_state(self, job_id: int, state: str, *, failed_stage: str | None = None,
                      error: str | None = None, agent_id: int | None = None, attempt: int | None = None) -> dict:
        """The agent's transitions of its job: the claim (running, with its agent id and the delivery's
        attempt), then succeeded or failed."""
        body = {"state": state, "failed_stage": failed_stage, "error": error, "agent": agent_id, "attempt": attempt}
        return self.request("POST", f"/jobs/{job_id}/state/", json={k: v for k, v in body.items() if v is not None})

    def set_node_state(self, job_id: int, rank: int, state: str, *, attempt: int | None = None,
                       error: str | None = None) -> dict:
        """A multi-node job's node ``rank`` > 0: claim its reservation (running), then finished or failed."""
        body = {"state": state, "attempt": attempt, "error": error}
        return self.request("POST", f"/jobs/{job_id}/nodes/{rank}/",
                            json={k: v for k, v in body.items() if v is not None})

    def post_node_events(self, job_id: int, rank: int, events: list[dict[str, Any]]) -> int:
        """Node ``rank``'s events in its own seqs; returns the highest contiguous seq the portal stored."""
        answer = self.request("POST", f"/jobs/{job_id}/nodes/{rank}/events/", json={"events": events})
        return int(answer["acked"])

    # ------------------------------------------------------------------ vendor calls

    def create_job(self, *, model: str, hardware: str, stages: list[str] | None = None,
                   dtype: str | None = None, **spec: Any) -> dict:
        body: dict[str, Any] = {"model": model, "hardware": hardware, **spec}
        if stages:
            body["stages"] = stages
        if dtype:
            body["dtype"] = dtype
        return self.request("POST", "/jobs/", json=body)

    def list_jobs(self, *, page_size: int = 50, **filters: str) -> dict:
        """One page of jobs, newest first: ``{"count", "results": [...]}`` (filters: state, model, hardware)."""
        return self.request("GET", "/jobs/", params={**filters, "page_size": page_size})

    def cancel_job(self, job_id: int) -> dict:
        return self.request("POST", f"/jobs/{job_id}/cancel/")

    def job_events(self, job_id: int, after: int = 0, node: int = 0) -> list[dict[str, Any]]:
        """Stored events of node ``node``'s sequence (0: the job's own) with seq > ``after``, in order (every
        page)."""
        events: list[dict[str, Any]] = []
        params = {"node": node} if node else {}
        while True:
            page = self.request("GET", f"/jobs/{job_id}/events/", params={"after": after, "limit": 5000, **params})
            events.extend(page["events"])
            after = int(page["next_after"])
            if not page.get("has_more"):
                return events

    def wait_for_portal(self, timeout: float = 30.0) -> None:
        """Blocks until ``/healthz`` answers, or raises ``PortalUnavailable``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                response = httpx.get(self.base_url + "/healthz", timeout=5)
                if response.status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise PortalUnavailable(0, f"no answer from {self.base_url}/healthz in {timeout:.0f}s")
            time.sleep(0.5)
