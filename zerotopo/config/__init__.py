"""Configuration: the config tree (``tree``), its one validator (``validate``) and the GPT-NeoX-style YAML
reader that fills it (``neox``)."""

from zerotopo.config.neox import load_neox_config
from zerotopo.config.tree import TrainConfig
from zerotopo.config.validate import validate

__all__ = ["TrainConfig", "load_neox_config", "validate"]
