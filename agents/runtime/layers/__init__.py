"""Shared building blocks of the native model families: parallel linears, embeddings, norms, rotary, attention,
MLP and MoE. Every parameter owns ``weight_loader(param, loaded, shard_id=None)`` that slices for its rank."""
