"""``serve``: once the engine is built, the heap made while starting is frozen (a later full collection walks only
what requests made), after the caller's own ``on_engine`` hook."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from agents.runtime.server import launcher


def test_serve_freezes_the_starting_heap_after_the_callers_engine_hook(monkeypatch, tmp_path):
    calls: list[tuple[str, int]] = []
    built: dict = {}

    class Server:  # build_server's uvicorn server: run() builds the engine, which calls on_engine
        config = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(runtime=SimpleNamespace(error=None))))

        def run(self) -> None:
            built["on_engine"]("the engine")
            calls.append(("after", gc.get_freeze_count()))

    def build_server(model_dir, **kwargs):
        built.update(kwargs, model_dir=model_dir)
        return Server()

    monkeypatch.setattr(launcher, "build_server", build_server)
    gc.unfreeze()
    try:
        assert launcher.serve(tmp_path, on_engine=lambda engine: calls.append((engine, gc.get_freeze_count())),
                              max_num_seqs=4) == 0
        assert built["model_dir"] == tmp_path and built["max_num_seqs"] == 4
        assert calls[0] == ("the engine", 0)  # the caller's hook first, nothing frozen yet
        assert calls[1][0] == "after" and calls[1][1] > 1000  # then the interpreter's and torch's objects
    finally:
        gc.unfreeze()
