"""Generic fallback: any architecture ``transformers`` knows runs through its own modeling code behind the
``RuntimeModel`` interface and the same strict weight checks as the native families.

Where its attention can be routed (``fallback_attention``: probed and self-checked once, on first use), it runs on the
runtime's paged KV cache: the engine batches it continuously with chunked prefill, the whole batch one packed
sequence through transformers' modules with the runtime's attention in place of theirs (``decode_path`` "paged").
Otherwise (``decode_reason`` says why, logged) it has no paged cache (``kv_cache_spec()`` is None) and the engine
recomputes each whole sequence every step (``decode_path`` "recompute"). A no-cache context (whole prompts: the
align stage's reference comparisons) always runs transformers' own attention, so it is transformers' computation.

A vision-language architecture whose transformers model takes precomputed image features (``mm_encoder_outputs``:
Qwen2-VL, Qwen2.5-VL) takes images here: ``encode_images`` runs its vision tower and merger once per request (the
engine keeps the features with the request), and each step's recompute passes them back with the image grids, so
the model splices them in and computes its own multimodal (M-RoPE) positions; the vision tower runs once.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from agents.runtime.context import ForwardContext
from agents.runtime.engine.multimodal import ImageInputs, config_takes_images
from agents.runtime.interface import ForwardOutput, KVCacheSpec
from agents.runtime.models.fallback_attention import PagedRouter, capture_outputs, route


class FallbackError(ValueError):
    """The config or the weights cannot run on the fallback path; the message names what is wrong."""


@dataclass
class _Target:
    """Where one checkpoint tensor goes: a view of a parameter, or flat element indices over fused parameters."""

    view: torch.Tensor | None = None
    alias_of: str | None = None
    index: torch.Tensor | None = None  # same shape as the checkpoint tensor: global element index
    sources: list[tuple[int, torch.Tensor]] | None = None  # (first global index, parameter) in index order
    shape: tuple[int, ...] = ()

    @property
    def shape_(self) -> tuple[int, ...]:
        return tuple(self.view.shape) if self.view is not None else self.shape

    @property
    def dtype_(self) -> torch.dtype:
        return self.view.dtype if self.view is not None else self.sources[0][1].dtype

    @torch.no_grad()
    def write(self, tensor: torch.Tensor) -> None:
        if self.view is not None:
            self.view.copy_(tensor)
            return
        flat_index, values = self.index.reshape(-1), tensor.reshape(-1)
        for start, param in self.sources:
            hit = (flat_index >= start) & (flat_index < start + param.numel())
            if bool(hit.any()):
                param.view(-1)[flat_index[hit] - start] = values[hit].to(param.dtype)


def _hf_config(config: dict[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not model_type:
        raise FallbackError("config.json has no 'model_type': the fallback cannot pick transformers' modeling code")
    if model_type not in CONFIG_MAPPING:
        raise FallbackError(f"model_type {model_type!r} is unknown to the installed transformers")
    return CONFIG_MAPPING[model_type].from_dict(dict(config))


def _hf_model_class(config: dict[str, Any], hf_config: Any) -> type[nn.Module]:
    """The class named by ``architectures[0]`` when transformers exports it, else the causal-LM auto class."""
    import transformers

    archs = config.get("architectures") or []
    cls = getattr(transformers, archs[0], None) if archs else None
    if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
        return cls
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    except KeyError:
        raise FallbackError(
            f"transformers has no causal-LM class for architecture {archs[:1]} (model_type {config.get('model_type')!r})"
        ) from None


def _decoder_layers(model: nn.Module, num_layers: int | None) -> nn.ModuleList | None:
    """The ModuleList of decoder blocks: the longest ModuleList whose length is the configured layer count,
    inside the decoder where the model names one (a vision tower's blocks may have the same count)."""
    best: nn.ModuleList | None = None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for module in (decoder if isinstance(decoder, nn.Module) else model).modules():
        if isinstance(module, nn.ModuleList) and (num_layers is None or len(module) == num_layers):
            if best is None or len(module) > len(best):
                best = module
    return best


def _takes_encoder_outputs(model: nn.Module) -> bool:
    """Whether the transformers model's base forward takes precomputed image features (``mm_encoder_outputs``)
    and has an image encoder (``get_image_features``)."""
    base = model.base_model
    return hasattr(model, "get_image_features") and "mm_encoder_outputs" in inspect.signature(base.forward).parameters


class FallbackModel(nn.Module):
    """A ``transformers`` causal LM wrapped as a ``RuntimeModel`` (path "fallback")."""

    path = "fallback"

    def __init__(self, config: dict[str, Any], *, dtype: torch.dtype = torch.float32, device: Any = "cpu") -> None:
        super().__init__()
        self.config = dict(config)
        hf_config = _hf_config(config)
        cls = _hf_model_class(config, hf_config)
        with torch.device(device):
            # full construction (random init included): some architectures compute buffers in their init hooks,
            # and those buffers are not in the checkpoint
            model = cls(hf_config)
        self.hf_model = model.to(dtype=dtype)
        self.eval()
        self.dtype = dtype
        self.device = torch.device(device)
        num_layers = getattr(hf_config.get_text_config(), "num_hidden_layers", None)
        self._layers = _decoder_layers(self.hf_model, num_layers)
        self._layout: dict[str, _Target] | None = None
        self._unexpected_ok = [re.compile(p) for p in (getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or [])]
        self.takes_images = config_takes_images(config) and _takes_encoder_outputs(self.hf_model)
        if self.takes_images:
            token = getattr(hf_config, "image_token_id", None)
            self.image_token_id = int(token if token is not None else hf_config.image_token_index)
        self.num_image_encodes = 0  # images encoded so far (once per request, not per step)
        self._takes_token_types = "mm_token_type_ids" in inspect.signature(self.hf_model.base_model.forward).parameters
        self._num_layers = num_layers
        self.recompute_only = False  # True before the engine is built: keep the recompute path (benchmarks' baseline)
        self._router: PagedRouter | None = None
        self._decode: tuple[str, str | None] | None = None  # ("paged" | "recompute", why not paged)

    # ---- weights ---------------------------------------------------------------------------------------------
    def _checkpoint_layout(self) -> dict[str, _Target]:
        """Checkpoint name -> where it lands. transformers renames and fuses some weights in memory (fused experts,
        renamed heads) and reverts that on save; reverting the live state dict gives the on-disk names and shapes.
        A reverted tensor that is a view of a parameter is written in place; any other (a fused layout) is located
        by reverting a state dict of element indices instead."""
        if self._layout is not None:
            return self._layout
        from transformers.core_model_loading import revert_weight_conversion

        state = self.hf_model.state_dict()
        owner = {t.untyped_storage().data_ptr(): t for t in state.values()}
        reverted = revert_weight_conversion(self.hf_model, state)
        layout: dict[str, _Target] = {}
        seen: dict[tuple, str] = {}
        copied: list[str] = []
        for name, t in reverted.items():
            if t.untyped_storage().data_ptr() not in owner:
                copied.append(name)
                continue
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
            layout[name] = _Target(view=t, alias_of=seen.get(key))  # a tied weight aliases its owner
            seen.setdefault(key, name)
        if copied:
            in_place = {t.view.untyped_storage().data_ptr() for t in layout.values()}
            fused = {n: t for n, t in state.items() if t.untyped_storage().data_ptr() not in in_place}
            offsets, index_state, start = [], {}, 0
            for n, t in fused.items():
                index_state[n] = torch.arange(start, start + t.numel(), dtype=torch.int64).view(t.shape)
                offsets.append((start, t))
                start += t.numel()
            index_reverted = revert_weight_conversion(self.hf_model, index_state)
            for name in copied:
                if name not in index_reverted:
                    raise FallbackError(f"cannot locate checkpoint tensor {name!r} in the transformers model")
                layout[name] = _Target(index=index_reverted[name], sources=offsets, shape=tuple(reverted[name].shape))
        self._layout = layout
        return layout

    def expected_tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Every tensor the checkpoint must hold: on-disk name -> (shape, dtype in this model). Tied aliases are
        optional, so not listed (``is_ignored`` accepts them)."""
        return {n: (t.shape_, t.dtype_) for n, t in self._checkpoint_layout().items() if t.alias_of is None}

    def is_ignored(self, name: str) -> bool:
        """Names the loader may see without an entry in ``expected_tensors``: tied aliases, and the patterns the
        transformers class itself ignores on load."""
        target = self._checkpoint_layout().get(name)
        return (target is not None and target.alias_of is not None) or any(p.search(name) for p in self._unexpected_ok)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the model as they stream, strictly: an unknown name, a wrong shape or a
        missing name is an error naming the tensor. Returns the names loaded."""
        layout = self._checkpoint_layout()
        loaded: set[str] = set()
        for name, tensor in weights:
            target = layout.get(name)
            if target is None:
                if self.is_ignored(name):
                    continue
                raise FallbackError(f"unexpected tensor {name!r}: {type(self.hf_model).__name__} has no such weight")
            if tuple(tensor.shape) != target.shape_:
                raise FallbackError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, the model expects {target.shape_}"
                )
            if not tensor.dtype.is_floating_point and target.dtype_.is_floating_point:
                raise FallbackError(f"tensor {name!r} has dtype {tensor.dtype}, the model expects {target.dtype_}")
            target.write(tensor)
            loaded.add(target.alias_of or name)
        missing = sorted(set(self.expected_tensors()) - loaded)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise FallbackError(f"missing tensor {missing[0]!r}{more}")
        self._layout = None  # drop the element-index maps of fused weights (8 bytes per element)
        return loaded

    # ---- images ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        """The processor's pixels (and ``extra``: ``image_grid_thw``) -> features [image tokens, hidden]: the
        architecture's own vision tower and merger (``get_image_features``), rows in placeholder order."""
        return self._encode(pixel_values, extra)[0]

    def _encode(self, pixel_values: torch.Tensor, extra: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """(features [image tokens, hidden], transformers' encoder output with its per-image features)."""
        if not self.takes_images:
            raise FallbackError(f"{type(self.hf_model).__name__} does not take images on the fallback path")
        extra = {k: v.to(self.device) for k, v in extra.items()}
        out = self.hf_model.get_image_features(pixel_values.to(device=self.device, dtype=self.dtype), **extra,
                                               return_dict=True)
        pooled = out.pooler_output
        features = torch.cat(list(pooled), 0) if isinstance(pooled, (list, tuple)) else pooled
        out.last_hidden_state = None  # the blocks' per-patch output: not read back, not worth keeping
        grid = extra.get("image_grid_thw")
        self.num_image_encodes += int(grid.shape[0]) if grid is not None else int(pixel_values.shape[0])
        return features.reshape(-1, features.shape[-1]), out  # features: [image tokens, hidden]

    def probe_image_inputs(self, device: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One random image for an operator trace, outside the trace: a grid tower's patches [h * w, C * T * P * P]
        and its grid [[1, h, w]] (h = w = 2 merges), else pixels [1, C, S, S] of the tower's image size."""
        vision = self.config["vision_config"]
        gen = torch.Generator().manual_seed(0)
        channels = int(vision.get("in_channels", vision.get("num_channels", 3)))
        if "spatial_merge_size" in vision:
            side = 2 * int(vision["spatial_merge_size"])
            frames, patch = int(vision.get("temporal_patch_size", 1)), int(vision["patch_size"])
            pixels = torch.randn((side * side, channels * frames * patch * patch), generator=gen)
            grid = torch.tensor([[1, side, side]], dtype=torch.int64, device=device)
            return pixels.to(device=device, dtype=self.dtype), {"image_grid_thw": grid}
        side = int(vision["image_size"])
        return torch.randn((1, channels, side, side), generator=gen).to(device=device, dtype=self.dtype), {}

    def _image_kwargs(self, ids: torch.Tensor, images: ImageInputs) -> dict[str, Any]:
        """The base model's keyword arguments for one sequence ``ids`` [1, L] with images: the request's encoder
        output (encoded on first use, kept with the request), the grids, and the token types (image: 1) its M-RoPE
        positions come from."""
        if images.encoder_output is None:  # the first step of the request: encode once, keep it whole
            images.features, images.encoder_output = self._encode(images.pixel_values, images.extra)
        n_tokens = int((ids == self.image_token_id).sum())
        if n_tokens != images.features.shape[0]:
            raise FallbackError(f"the sequence holds {n_tokens} image tokens for {images.features.shape[0]} image "
                                "feature vectors")
        kwargs = {"mm_encoder_outputs": {"image": images.encoder_output},
                  **{k: v.to(self.device) for k, v in images.extra.items()}}
        if self._takes_token_types:  # M-RoPE models find the image tokens' positions from these
            kwargs["mm_token_type_ids"] = (ids == self.image_token_id).int()
        return kwargs

    # ---- the paged path --------------------------------------------------------------------------------------
    def _routing(self) -> PagedRouter | None:
        """The paged layers, probed and self-checked on first use (with the weights loaded by then, if any);
        None when the architecture keeps the recompute path (``decode_reason``)."""
        if self.recompute_only:
            return None
        if self._decode is None:
            self._router, reason = route(self.hf_model, self._num_layers, self.dtype, self.device,
                                         takes_images=self.takes_images)
            self._decode = ("paged" if self._router is not None else "recompute", reason)
        return self._router

    @property
    def decode_path(self) -> str:
        """"paged" (the runtime's KV cache and batching) or "recompute" (the whole sequence every step)."""
        return "paged" if self._routing() is not None else "recompute"

    @property
    def decode_reason(self) -> str | None:
        """Why the model keeps the recompute path (None on the paged path)."""
        if self._routing() is not None:
            return None
        return "kept selectable: recompute_only" if self.recompute_only else self._decode[1]

    # ---- RuntimeModel ----------------------------------------------------------------------------------------
    def kv_cache_spec(self) -> KVCacheSpec | None:
        router = self._routing()
        if router is None:
            return None
        return KVCacheSpec("kv", num_layers=len(router.shapes), num_kv_heads=router.num_kv_heads,
                           head_dim=router.head_dim, dtype=self.dtype)

    def bind_kv_cache(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        if not caches:
            return
        router = self._routing()
        if router is None:
            raise FallbackError(f"this model has no paged KV cache: {self.decode_reason}")
        router.bind(caches)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        ctx: ForwardContext,
        output_hidden_states: bool = False,
        images: list[ImageInputs | None] | None = None,
    ) -> ForwardOutput:
        """``images``: per sequence of the batch, its image inputs or None (a text-only sequence; the paged path
        takes text only)."""
        if ctx.uses_cache:
            if images is not None and any(i is not None for i in images):
                raise FallbackError("the paged fallback path takes text only")
            return self._forward_paged(input_ids, positions, ctx, output_hidden_states)
        if not bool(torch.equal(ctx.seqlens_k.to(torch.int64), ctx.cu_seqlens_q.diff().to(torch.int64))):
            raise FallbackError("the fallback path needs whole sequences: seqlens_k must equal the query lengths")
        base = self.hf_model.base_model
        finals: list[torch.Tensor] = []
        per_seq_layers: list[list[torch.Tensor]] = []
        with capture_outputs(self._hidden_layers(output_hidden_states)) as captured:
            cu = ctx.cu_seqlens_q.tolist()
            if images is not None and len(images) != len(cu) - 1:
                raise FallbackError(f"{len(images)} image inputs for {len(cu) - 1} sequences")
            for i, (start, end) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
                captured.clear()
                ids = input_ids[start:end].unsqueeze(0)  # [1, L]
                pos = positions[start:end].unsqueeze(0)  # [1, L]
                seq_images = images[i] if images is not None else None
                if seq_images is not None:  # the model's own multimodal positions (M-RoPE) from ids and grids
                    if not self.takes_images:
                        raise FallbackError(f"{type(self.hf_model).__name__} does not take images")
                    out = base(input_ids=ids, use_cache=False, **self._image_kwargs(ids, seq_images))
                else:
                    out = base(input_ids=ids, position_ids=pos, use_cache=False)
                finals.append(out.last_hidden_state[0])  # [L, hidden]
                per_seq_layers.append([h[0] for h in captured])
        hidden = torch.cat(finals, 0) if finals else input_ids.new_zeros((0,), dtype=self.dtype)  # [T, hidden]
        layer_hidden = None
        if output_hidden_states:
            layer_hidden = [torch.cat([seq[i] for seq in per_seq_layers], 0) for i in range(len(self._layers))]
        return ForwardOutput(hidden=hidden, layer_hidden=layer_hidden)

    def _forward_paged(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                       output_hidden_states: bool) -> ForwardOutput:
        """The whole step as one packed sequence (batch 1 × T tokens), attention through the paged cache."""
        router = self._routing()
        if router is None:
            raise FallbackError(f"this model has no paged KV cache: {self.decode_reason}")
        with capture_outputs(self._hidden_layers(output_hidden_states)) as captured, router.step(ctx):
            out = self.hf_model.base_model(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        layer_hidden = [h[0] for h in captured] if output_hidden_states else None  # each: [T, hidden]
        return ForwardOutput(hidden=out.last_hidden_state[0], layer_hidden=layer_hidden)  # hidden: [T, hidden]

    def _hidden_layers(self, wanted: bool) -> nn.ModuleList | list[nn.Module]:
        """The decoder blocks whose outputs a forward reports (none unless ``wanted``)."""
        if wanted and self._layers is None:
            raise FallbackError("cannot find the decoder layer list to report per-layer hidden states")
        return self._layers if wanted else []

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.hf_model.get_output_embeddings()
        if head is None:
            raise FallbackError(f"{type(self.hf_model).__name__} has no output embeddings (not a causal LM)")
        return head(hidden)  # [N, vocab], in the model dtype like the native heads
