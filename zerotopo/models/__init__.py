"""GPT-NeoX-style models. Plain PyTorch: nothing here knows about sharding."""
