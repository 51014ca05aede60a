"""Built-in topologies and configs are found by name; paths pass through; unknown names list the built-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerotopo.errors import ConfigError
from zerotopo.placement.topology import load_topology
from zerotopo.resources import builtin_file, builtin_names, resolve_config_paths

ROOT = Path(__file__).resolve().parent.parent


def test_builtin_names_match_the_shipped_files():
    assert builtin_names("topologies") == sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
    assert "neox-20b" in builtin_names("configs") and "tiny" in builtin_names("configs")
    assert builtin_file("configs", "nonexistent") is None


def test_config_names_and_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # names resolve from any directory
    (path,) = resolve_config_paths(["neox-20b"])
    assert Path(path).name == "neox-20b.yml" and Path(path).is_file()
    own = tmp_path / "mine.yml"
    own.write_text("num_layers: 2\n")
    assert resolve_config_paths([str(own)]) == [str(own)]
    with pytest.raises(ConfigError, match="neither a config file nor a built-in config.*neox-125m"):
        resolve_config_paths(["neox-21b"], source="--model")
    with pytest.raises(ConfigError, match="missing.yml"):
        resolve_config_paths(["configs/missing.yml"])
    assert load_topology("frontier").name == "frontier"
