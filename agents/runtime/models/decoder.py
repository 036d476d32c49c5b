"""The decoder skeleton shared by the native families: embedding, N blocks (attention + MLP or MoE),
final norm, LM head; the checkpoint-name mapping each family declares as data; KV-cache binding."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from agents.runtime.context import ForwardContext
from agents.runtime.interface import ForwardOutput, KVCacheSpec
from agents.runtime.layers.attention import AttentionMetadata
from agents.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from agents.runtime.layers.mlp import SwiGLUMLP
from agents.runtime.layers.norm import RMSNorm
from agents.runtime.layers.quant import TensorSpec, declare_checkpoint
from agents.runtime.layers.rotary import RotaryEmbedding
from agents.runtime.layers.self_attention import SelfAttention
from agents.runtime.layers.weights import column_major
from agents.runtime.models.mapping import WeightMapping

# Checkpoint fragment -> parameter fragment, shard id ("{e}" matches an expert index).
DENSE_MAPPING: list[tuple[str, str, Hashable]] = [
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
]


def require(config: dict[str, Any], key: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"config.json is missing {key!r}")
    return config[key]


class DecoderLayer(nn.Module):
    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), meta)  # h: [T, hidden]
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderCausalLM(nn.Module):
    """Base of the native dense/MoE families. Subclasses set ``weight_mapping`` and implement ``make_mlp``."""

    path = "native"
    weight_mapping: ClassVar[list[tuple[str, str, Hashable]]] = DENSE_MAPPING
    ignored_checkpoint_names: ClassVar[list[str]] = [r"rotary_emb\.inv_freq$"]
    qk_norm: ClassVar[bool] = False

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.hidden = require(config, "hidden_size")
        self.num_heads = require(config, "num_attention_heads")
        self.num_kv_heads = config.get("num_key_value_heads") or self.num_heads
        self.head_dim = config.get("head_dim") or self.hidden // self.num_heads
        self.num_layers = require(config, "num_hidden_layers")
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.dtype = torch.get_default_dtype()
        self.rotary = RotaryEmbedding(self.head_dim, config)
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(require(config, "vocab_size"), self.hidden)
        self.model.layers = nn.ModuleList(
            DecoderLayer(self.make_attention(i), self.make_mlp(i), self.hidden, self.eps) for i in range(self.num_layers)
        )
        self.model.norm = RMSNorm(self.hidden, self.eps)
        self.lm_head = ParallelLMHead(config["vocab_size"], self.hidden)
        ignored = list(self.ignored_checkpoint_names)
        if config.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
            ignored.append(r"^lm_head\.weight$")
        self.mapping = WeightMapping(self.weight_mapping, ignored)
        self._decode_layout = False  # set once the dense linears have their decode-friendly layout

    def use_decode_layout(self) -> None:
        """Column-major storage for the linears whose batch-1 matrix-vector product streams faster so (see
        ``column_major`` and ``dense_linear``): the LM head always, the layers' linears when torch runs one
        thread (with more, oneDNN reads their row-major weights on every thread). Done on the first forward."""
        modules: list[nn.Module] = [] if self.lm_head.weight is self.model.embed_tokens.weight else [self.lm_head]
        for layer in self.model.layers if torch.get_num_threads() == 1 else []:
            if isinstance(layer.self_attn, SelfAttention):
                modules += [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
            if isinstance(layer.mlp, SwiGLUMLP):
                modules += [layer.mlp.gate_up_proj, layer.mlp.down_proj]
        for module in modules:
            column_major(module.weight)
        self._decode_layout = True

    # ---- family hooks ------------------------------------------------------------------------------------
    def make_attention(self, layer: int) -> nn.Module:
        c = self.config
        window = c.get("sliding_window") if c.get("use_sliding_window", True) else None
        return SelfAttention(
            self.hidden, self.num_heads, self.num_kv_heads, self.head_dim, self.rotary,
            qkv_bias=bool(c.get("attention_bias", False)), o_bias=bool(c.get("attention_bias", False)),
            qk_norm_eps=self.eps if self.qk_norm else None, sliding_window=window,
        )

    def make_mlp(self, layer: int) -> nn.Module:
        raise NotImplementedError

    # ---- RuntimeModel ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                output_hidden_states: bool = False) -> ForwardOutput:
        if not self._decode_layout:
            self.use_decode_layout()
        with torch.inference_mode():
            meta = AttentionMetadata.build(ctx)
            meta.cos, meta.sin = self.rotary.cos_sin(positions, max(ctx.max_seqlen_k, 1), self.dtype)
            x = self.model.embed_tokens(input_ids)  # x: [T, hidden]
            layer_hidden: list[torch.Tensor] | None = [] if output_hidden_states else None
            for layer in self.model.layers:
                x = layer(x, meta)
                if layer_hidden is not None:
                    layer_hidden.append(x)
            return ForwardOutput(self.model.norm(x), layer_hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            logits = self.lm_head.compute_logits(hidden)  # [N, vocab]
            return logits if logits.dtype == torch.float32 else logits.float()

    def attention_layers(self) -> list[nn.Module]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def kv_cache_spec(self) -> KVCacheSpec | None:
        attn = self.attention_layers()[0]
        return KVCacheSpec("kv", self.num_layers, attn.num_kv_heads, attn.head_dim, dtype=self.dtype)

    def bind_kv_cache(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        layers = self.attention_layers()
        if len(caches) != len(layers):
            raise ValueError(f"got {len(caches)} cache tuples for {len(layers)} layers")
        for i, (attn, pair) in enumerate(zip(layers, caches, strict=False)):
            if len(pair) != 2 or pair[0].shape != pair[1].shape or pair[0].dim() != 4 or tuple(
                    pair[0].shape[2:]) != (attn.num_kv_heads, attn.head_dim):
                raise ValueError(f"layer {i}: expected (k_cache, v_cache) of [blocks, block_size, "
                                 f"{attn.num_kv_heads}, {attn.head_dim}], got {[tuple(t.shape) for t in pair]}")
            attn.bind(*pair)

    # ---- weights -----------------------------------------------------------------------------------------
    def expected_tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Every checkpoint tensor this model needs, with its full (unsliced) shape."""
        out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        for name, param in self.named_parameters():
            for shard in param.shards:
                out[self.mapping.checkpoint_name(name, shard)] = (tuple(param.checkpoint_shape(shard)), param.dtype)
        return out

    def checkpoint_tensors(self) -> dict[str, TensorSpec]:
        """Per checkpoint name: shape and accepted storage (FP8 with its block scale, per ``layers/quant.py``)."""
        return declare_checkpoint(self, self.config, self.mapping.checkpoint_name)

    def is_ignored(self, name: str) -> bool:
        return self.mapping.ignored(name)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each checkpoint tensor's rank slice into its parameter; returns the names loaded."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self._decode_layout = False  # a whole-tensor load may adopt a row-major tensor again
        with torch.no_grad():
            for name, tensor in weights:
                if self.mapping.ignored(name):
                    continue
                param_name, shard = self.mapping.target(name)
                param = params.get(param_name)
                if param is None:
                    raise KeyError(f"unexpected tensor {name!r}: {type(self).__name__} has no parameter for it")
                param.weight_loader(param, tensor, shard)
                loaded.add(name)
        return loaded



