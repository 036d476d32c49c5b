"""The decoder skeleton shared by the native families: embedding, N blocks (attention + MLP or MoE),
final norm, LM head; the checkpoint-name mapping each family declares as data; KV-cache binding.

Under pipeline parallelism a rank builds only its stage: its contiguous share of the layers (the rest are
parameterless ``StageSkip`` placeholders, so parameter names stay the checkpoint's), the embedding on the first
stage, the norm and LM head on the last. Checkpoint tensors of other stages are ignored, never loaded. Each
stage receives the hidden states of the one before and sends its own on; the last stage's logits are
broadcast, so every rank samples the same tokens."""

from __future__ import annotations

import logging
import re
from collections.abc import Hashable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from agents.runtime.context import ForwardContext
from agents.runtime.distributed import broadcast, get_parallel_state, recv, send, stage_peer
from agents.runtime.interface import ForwardOutput, KVCacheSpec
from agents.runtime.layers.attention import AttentionMetadata
from agents.runtime.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from agents.runtime.layers.linear import is_packed, pack_layout, pack_weight
from agents.runtime.layers.mlp import SwiGLUMLP
from agents.runtime.layers.moe import RoutedExperts
from agents.runtime.layers.norm import RMSNorm
from agents.runtime.layers.quant import TensorSpec, declare_checkpoint
from agents.runtime.layers.rotary import RotaryEmbedding
from agents.runtime.layers.self_attention import SelfAttention
from agents.runtime.layers.weights import column_major
from agents.runtime.models.mapping import WeightMapping
from agents.runtime.models.native_decode import DecodePlan, native_decode_enabled

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
        h, normed = self.post_attention_layernorm.add_forward(x, self.self_attn(self.input_layernorm(x), meta))
        return h + self.mlp(normed)  # h, normed: [T, hidden]

    def forward_rows(self, x: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``rows`` [N] of the step's tokens only: attention runs over every token (their
        keys and values are cached), the output projection, residual and MLP over those rows."""
        attended = self.self_attn(self.input_layernorm(x), meta, rows=rows)  # [N, hidden]
        h, normed = self.post_attention_layernorm.add_forward(x.index_select(0, rows), attended)
        return h + self.mlp(normed)  # [N, hidden]


class StageSkip(nn.Module):
    """A layer another pipeline stage runs (no parameters here)."""


def stage_layers(num_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """[first, end) of the layers of pipeline ``stage``: the first ``num_layers % pp`` stages take one more."""
    base, extra = divmod(num_layers, pp)
    first = stage * base + min(stage, extra)
    return first, first + base + (1 if stage < extra else 0)


log = logging.getLogger(__name__)

_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")


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
        state = get_parallel_state()
        self.pp_rank, self.pp_size, self.stage_size = state.pp_rank, state.pp_size, state.stage_size
        if self.pp_size > self.num_layers:
            raise ValueError(f"pp={self.pp_size} is more pipeline stages than the {self.num_layers} layers")
        self.first_layer, self.end_layer = stage_layers(self.num_layers, self.pp_size, self.pp_rank)
        self.is_first, self.is_last = self.pp_rank == 0, self.pp_rank == self.pp_size - 1
        tied = bool(config.get("tie_word_embeddings", False))
        self.model = nn.Module()
        self.model.embed_tokens = (VocabParallelEmbedding(require(config, "vocab_size"), self.hidden)
                                   if self.is_first or (tied and self.is_last) else None)
        self.model.layers = nn.ModuleList(
            DecoderLayer(self.make_attention(i), self.make_mlp(i), self.hidden, self.eps)
            if self.first_layer <= i < self.end_layer else StageSkip() for i in range(self.num_layers)
        )
        self.model.norm = RMSNorm(self.hidden, self.eps) if self.is_last else None
        self.lm_head = ParallelLMHead(config["vocab_size"], self.hidden) if self.is_last else None
        ignored = list(self.ignored_checkpoint_names)
        if tied:
            if self.lm_head is not None:
                self.lm_head.weight = self.model.embed_tokens.weight
            ignored.append(r"^lm_head\.weight$")
        self.mapping = WeightMapping(self.weight_mapping, ignored)
        self._decode_layout = False  # set once the dense linears have their decode-friendly layout
        # honour ``ctx.sample_rows`` (the last layer on the rows that sample only); the compiled path, whose
        # region is the whole layer, turns it off while installed
        self.prune_last_layer = True
        # decode steps through ``native_decode.DecodePlan`` where it covers the layers (the compiled path turns it
        # off while installed); the plan is made on the first decode step and dropped when weights or caches change
        self.native_decode = native_decode_enabled()
        self._decode_plan: DecodePlan | None | bool = False  # False: not made yet; None: the layers are not covered
        self.decode_plan_reason: str | None = None
        self.decode_steps = self.native_decode_steps = 0  # this stage's decode forwards, and those the plan ran
        self._decode_plan_said = ""

    def use_decode_layout(self) -> None:
        """Column-major storage for the linears whose batch-1 matrix-vector product streams faster so (see
        ``column_major`` and ``dense_linear``): the LM head always, the layers' linears when torch runs one
        thread (with more, oneDNN reads their row-major weights on every thread). Done on the first forward."""
        head = self.lm_head
        tied = head is None or self.model.embed_tokens is not None and head.weight is self.model.embed_tokens.weight
        modules: list[nn.Module] = [] if tied else [head]
        for layer in self.stage_layers if torch.get_num_threads() == 1 else []:
            if isinstance(layer.self_attn, SelfAttention):
                modules += [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
            if isinstance(layer.mlp, SwiGLUMLP):
                modules += [layer.mlp.gate_up_proj, layer.mlp.down_proj]
        for module in modules:
            column_major(module.weight)
        self._decode_layout = True

    def pack_weights(self) -> int:
        """Pack the layers' dense fp32 CPU weights in place (``pack_weight``: the native kernels' panels, else
        oneDNN's blocks): the attention and MLP projections, shared experts included, and the LM head, a tied one
        (the embedding table) too where the layout is panels: the table then reads its rows from the head's
        panels (``embedding_rows``), one copy (SmolLM2-135M's 49152 x 576 head is a fifth of its decode reads).
        Panels stream 1.5-2x faster than a plain or oneDNN weight at 1-2 rows and run batched products at oneDNN's
        rate; oneDNN's blocks run batched steps 1.2-2x faster than the plain layout. Routed experts' stacks become panels too (``RoutedExperts.pack_panels``; with oneDNN's layout they
        stay stacked). Call after loading; returns the number of weights packed."""
        modules: list[nn.Module] = []
        for layer in self.stage_layers:
            if isinstance(layer.self_attn, SelfAttention):
                modules += [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
            mlps = [layer.mlp, getattr(layer.mlp, "shared_experts", None)]
            modules += [m for mlp in mlps if isinstance(mlp, SwiGLUMLP) for m in (mlp.gate_up_proj, mlp.down_proj)]
        head, embed = self.lm_head, self.model.embed_tokens
        tied = head is not None and embed is not None and head.weight is embed.weight
        if head is not None and (not tied or pack_layout() == "panels"):  # oneDNN's blocks: no embedding rows
            modules.append(head)
        self.invalidate_decode_plan()
        packed = sum(pack_weight(module) for module in modules)
        if tied and head.weight is not embed.weight:  # one copy: the table reads its rows from the head's panels
            embed.weight = head.weight
        for layer in self.stage_layers:  # routed experts: both stacks as panels where the kernels run
            experts = getattr(layer.mlp, "experts", None)
            if isinstance(experts, RoutedExperts) and experts.pack_panels():
                packed += 2
        self.use_decode_layout()  # what is left plain (``column_major`` leaves packed weights alone)
        return packed

    def panels_at_load(self) -> int:
        """Before loading: routed experts that ``pack_weights`` would turn into panels get empty panels now, and
        their checkpoint shards are packed straight into them while loading (``RoutedExperts.load_as_panels``);
        returns how many weights (two per MoE layer)."""
        switched = 0
        for layer in self.stage_layers:
            experts = getattr(layer.mlp, "experts", None)
            if isinstance(experts, RoutedExperts) and experts.load_as_panels():
                switched += 2
        return switched

    def invalidate_decode_plan(self) -> None:
        """Forget the native decode plan (it holds the addresses of weights and caches): made again on the next
        decode step. Called when weights are loaded or packed, caches bound, or the module moved or cast."""
        self._decode_plan = False

    def _apply(self, fn, recurse: bool = True):  # .to(), .float(), ...: tensors may be new
        self.invalidate_decode_plan()
        return super()._apply(fn, recurse)

    def decode_plan(self) -> DecodePlan | None:
        """The native decode plan of this stage's layers (made once), or None when they are not covered
        (``decode_plan_reason`` says why; logged once)."""
        if self._decode_plan is False:
            plan = DecodePlan.build(self.stage_layers, self.hidden)
            self._decode_plan, self.decode_plan_reason = (None, plan) if isinstance(plan, str) else (plan, None)
            said = (f"{len(self.stage_layers)} layers in {len(plan.runs)} native call(s) a step"
                    if self._decode_plan is not None else f"not used: {plan}")
            if said != self._decode_plan_said:
                log.info("native decode: %s", said)
                self._decode_plan_said = said
        return self._decode_plan

    @property
    def stage_layers(self) -> list[nn.Module]:
        """The layers this pipeline stage runs."""
        return list(self.model.layers)[self.first_layer:self.end_layer]

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
                output_hidden_states: bool = False,
                input_embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> ForwardOutput:
        """``input_embeds``: (rows [K], vectors [K, hidden]) that replace those rows' token embeddings (image
        features in place of a vision-language model's placeholder tokens)."""
        if not self._decode_layout:
            self.use_decode_layout()
        with torch.inference_mode():
            meta = AttentionMetadata.build(ctx)
            meta.cos, meta.sin = self.rotary.cos_sin(positions, max(ctx.max_seqlen_k, 1), self.dtype)
            if self.is_first:
                x = self.model.embed_tokens(input_ids)  # x: [T, hidden]
                if input_embeds is not None:
                    x = x.index_copy(0, input_embeds[0], input_embeds[1].to(x.dtype))
            else:  # the previous stage's hidden states
                x = recv(torch.empty((input_ids.shape[0], self.hidden), dtype=self.dtype, device=input_ids.device),
                         stage_peer(-1))
            self.decode_steps += ctx.is_decode and not output_hidden_states
            if self.native_decode and not output_hidden_states and ctx.is_decode:
                plan = self.decode_plan()
                stepped = plan.forward(x, meta) if plan is not None and plan.usable(x, meta) else None
                if stepped is not None:  # the residual stream and the last MLP's output, not yet added
                    self.native_decode_steps += 1
                    if self.is_last:
                        return ForwardOutput(self.model.norm.add_forward(*stepped)[1])
                    x = stepped[0] + stepped[1]
                    send(x, stage_peer(1))
                    return ForwardOutput(x)
            layer_hidden: list[torch.Tensor] | None = [] if output_hidden_states else None
            layers = self.stage_layers
            rows = ctx.sample_rows if self.is_last and self.prune_last_layer and not output_hidden_states else None
            if rows is not None and (layers[-1]._forward_hooks or layers[-1]._forward_pre_hooks):
                rows = None  # a hook on the last layer sees its whole output, as on the others
            for layer in layers[:-1] if rows is not None else layers:
                x = layer(x, meta)
                if layer_hidden is not None:
                    layer_hidden.append(x)
            if not self.is_last:
                send(x, stage_peer(1))
                return ForwardOutput(x, layer_hidden)  # x: [T, hidden], this stage's output (not normed)
            if rows is not None:  # the rows nobody reads skip the last layer's projection and MLP
                return ForwardOutput(self.model.norm(layers[-1].forward_rows(x, meta, rows)), rows=rows)  # [N, hidden]
            return ForwardOutput(self.model.norm(x), layer_hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in fp32 on every rank (the last pipeline stage computes and broadcasts them)."""
        with torch.inference_mode():
            if self.is_last:
                logits = self.lm_head.compute_logits(hidden)  # [N, vocab]
                logits = (logits if logits.dtype == torch.float32 else logits.float()).contiguous()  # sent whole
            else:
                logits = torch.empty((hidden.shape[0], self.config["vocab_size"]), dtype=torch.float32,
                                     device=hidden.device)
            if self.pp_size > 1:
                broadcast(logits, (self.pp_size - 1) * self.stage_size)  # src: the last stage's first rank
            return logits

    def attention_layers(self) -> list[nn.Module]:
        return [layer.self_attn.attn for layer in self.stage_layers]

    def kv_cache_spec(self) -> KVCacheSpec | None:
        attn = self.attention_layers()[0]
        return KVCacheSpec("kv", len(self.stage_layers), attn.num_kv_heads, attn.head_dim, dtype=self.dtype)

    def bind_kv_cache(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        layers = self.attention_layers()
        if len(caches) != len(layers):
            raise ValueError(f"got {len(caches)} cache tuples for {len(layers)} layers")
        self.invalidate_decode_plan()
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
        """A checkpoint tensor this rank does not load: ignored by the family, or another pipeline stage's."""
        return self.mapping.ignored(name) or self.other_stage(name)

    def other_stage(self, name: str) -> bool:
        """A checkpoint tensor of another pipeline stage: this rank never reads it."""
        if self.pp_size == 1:
            return False
        match = _LAYER_NAME.match(name)
        if match:
            return not self.first_layer <= int(match.group(1)) < self.end_layer
        if name.startswith("model.embed_tokens."):
            return self.model.embed_tokens is None
        return name.startswith(("model.norm.", "lm_head.")) and not self.is_last

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each checkpoint tensor's rank slice into its parameter; returns the names loaded."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self._decode_layout = False  # a whole-tensor load may adopt a row-major tensor again
        self.invalidate_decode_plan()
        with torch.no_grad():
            for name, tensor in weights:
                if self.is_ignored(name):
                    continue
                param_name, shard = self.mapping.target(name)
                param = params.get(param_name)
                if param is None:
                    raise KeyError(f"unexpected tensor {name!r}: {type(self).__name__} has no parameter for it")
                if is_packed(param) and not getattr(param, "loads_panels", False):
                    raise RuntimeError(f"{param_name} is packed (pack_weights): load before packing")
                param.weight_loader(param, tensor, shard)
                loaded.add(name)
        return loaded



