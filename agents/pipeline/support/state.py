"""What the stages of one job hand on to later stages in this process: objects, not evidence (the report's
sections are ``StageContext.results``). One typed field per thing handed on; a stage that needs what another
stage made reads the field, and one that may run alone makes it itself (``support.models``, ``support.server``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from agents.pipeline.support.server_process import ServerProcess
    from agents.runtime.engine import LLMEngine


@dataclass
class JobState:
    """The per-job state the stages share (every field starts empty)."""

    # the runner's stage list in pipeline order: a stage keeps what a later one needs (bench: the server for eval)
    stages_requested: tuple[str, ...] = ()
    # the caller's name for the model (``day0 adapt`` on a config alone: the file's stem); None: the directory's
    model_name: str | None = None
    # the runtime model in this process (the load stage's at TP=1, else the first stage that needed one loads it)
    model: Any = None
    # the runtime model in fp32 when the target runs another dtype (align's layer report and KV-cache check)
    model_fp32: Any = None
    # ``transformers``' fp32 CPU reference of the same checkpoint (align, eval, reference)
    reference_model: nn.Module | None = None
    # the model's own tokenizer; ``tokenizer_loaded`` tells "none in the checkpoint" from "not looked for yet"
    tokenizer: Any = None
    tokenizer_loaded: bool = False
    # the whole vision-language reference, and the fp32 engine align's image prompts run through
    reference_vlm: nn.Module | None = None
    vision_engine: LLMEngine | None = None
    # the ``day0 serve`` the serve stage started (bench, eval and soak reuse it; the last user stops it)
    server: ServerProcess | None = None
    # the URL of a server whose compile evidence the serve stage checked (the bench compares it with eager)
    compiled_server: str | None = None

    def drop_models(self) -> None:
        """Forget the runtime's copies of the weights (a stage that needs only the reference frees them)."""
        self.model = None
        self.model_fp32 = None
