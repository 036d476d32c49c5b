"""Paged KV cache, continuous batching scheduler, sampler and the engine loop."""

from agents.runtime.engine.config import EngineConfig
from agents.runtime.engine.llm_engine import LLMEngine
from agents.runtime.engine.outputs import QueueFullError, RequestError, RequestOutput
from agents.runtime.engine.sampling_params import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "QueueFullError", "RequestError", "RequestOutput", "SamplingParams"]
