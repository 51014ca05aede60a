"""Configuration: GPT-NeoX-style YAML training configs (``neox``)."""

from zerotopo.config.neox import NeoXArgs, load_neox_config

__all__ = ["NeoXArgs", "load_neox_config"]
