"""The compiled path (``day0 serve --compile``): the native decoder layers compiled with ``torch.compile``
(Inductor, ``dynamic=True`` over the step's token count), beside the eager path on the same weights.

What is compiled: one decoder layer's forward (``DecoderLayer.forward``: norms, QKV and output projections,
QK-norm, RoPE, the MLP, the MoE router and shared experts). Every layer of a model has the same code and
structure, so Dynamo compiles that region once per shape class (a step of one token, a step of several) and
every layer reuses it: the compile time does not grow with depth. What stays eager, as opaque custom ops
inside the compiled graph:

* paged attention (``day0::paged_attention``): the batch layout lives in Python lists (each sequence's query
  bounds, the mixed prefill/decode split) and the op writes the paged KV cache with ``index_copy_``; MLA
  (DeepSeek-V3) runs as a whole block (``day0::whole_attention``: projections, latent cache write, attention);
* routed experts (``day0::routed_experts``): their per-expert token counts are read on the host.

Inside the graph both are calls that take and return tensors whose only dynamic size is the token count, so a
new batch layout (other sequence lengths, another mix of prefills and decodes) never recompiles. The step's
``AttentionMetadata`` reaches the attention op through this module's step slot, set by each layer's wrapper
just before the compiled region runs; the op finds its layer by a one-element key tensor of that layer (an
argument, so the graph has no per-layer constant and stays shared; the KV cache itself is no graph input, so
the pool's size, which follows the free memory at start, never changes the graph or its cache key).

``CompileStats`` records what the compiled path cost and did: compile seconds (the calls that compiled
something, the warm-up's), graphs, graph breaks with their reasons, recompiles after the warm-up with Dynamo's
guard-failure reasons, and the hits and misses of Inductor's FX graph cache and the AOT autograd cache (on a
second start with the same cache directory the graphs come from the cache). Inductor's CPU backend compiles
C++: ``check_cpp_compiler`` says clearly when no compiler answers."""

from agents.runtime.engine.compiled.model import CompiledModel, inductor_gemms
from agents.runtime.engine.compiled.stats import CompileStats
from agents.runtime.engine.compiled.toolchain import (
    CACHE_ENV,
    CompileUnavailable,
    check_cpp_compiler,
    configure_caches,
    default_cache_dir,
)

__all__ = ["CACHE_ENV", "CompileStats", "CompileUnavailable", "CompiledModel", "check_cpp_compiler", "configure_caches",
           "default_cache_dir", "inductor_gemms"]
