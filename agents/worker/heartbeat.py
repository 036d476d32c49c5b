"""The agent's heartbeat: a daemon thread telling the portal every few seconds that this agent is alive and
which job it runs. A job whose agent stops heartbeating is declared lost by the portal and re-queued."""

from __future__ import annotations

import logging
import threading

from agents.worker.agent_state import AgentState
from agents.worker.client import PortalClient, PortalError

logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, state: AgentState, interval: float = 5.0, lock_every: int = 60) -> None:
        self.state = state
        self.interval = interval
        self.lock_every = lock_every  # every Nth beat re-reads the environment lock (a driver upgraded under us)
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="day0-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        client = PortalClient(self.state.portal_url, self.state.token, timeout=10)
        while True:
            if self.state.agent_id is not None:
                try:
                    client.heartbeat(self.state.agent_id, current_job=self.state.current_job,
                                     versions=self._lock() if self.beats % self.lock_every == self.lock_every - 1
                                     else None)
                    self.beats += 1
                except PortalError as exc:
                    logger.warning("heartbeat failed: %s", exc)
            if self._stop.wait(self.interval):
                break
        client.close()

    def _lock(self) -> dict | None:
        from agents.pipeline.support.environment import environment_lock

        try:
            return environment_lock(self.state.device)
        except Exception as exc:  # a lock that cannot be read never stops the heartbeat
            logger.warning("environment lock not read: %s", exc)
            return None

    def stop(self) -> None:
        """Stops beating; a last beat (2 s at most) tells the portal this agent runs no job any more, so a job
        it left is re-queued at the portal's next check instead of after ``DAY0_AGENT_LOST_SECONDS``."""
        self._stop.set()
        self._thread.join(timeout=2)
        if self.state.agent_id is None:
            return
        try:
            with PortalClient(self.state.portal_url, self.state.token, timeout=2) as client:
                client.heartbeat(self.state.agent_id, current_job=None)
        except PortalError as exc:
            logger.info("last heartbeat not delivered: %s", exc)
