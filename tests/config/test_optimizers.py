"""The optimizer table against torch's own classes, and the ``optimizer`` block of a NeoX config:
types in any case, each hyperparameter checked against what the type takes."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from zerotopo.config.neox import load_neox_config, to_neox_dict
from zerotopo.config.optimizers import ALIASES, NON_NEGATIVE, REFUSED, SPECS, spec_for
from zerotopo.errors import ConfigError

# Hyperparameters that switch every optional state on.
ALL_ON = {"amsgrad": True, "momentum": 0.9, "centered": True}


@pytest.mark.parametrize("spec", SPECS.values(), ids=lambda s: s.name)
def test_table_matches_torchs_class(spec):
    cls = getattr(torch.optim, spec.torch_class)
    sig = inspect.signature(cls.__init__).parameters
    assert {"lr", "weight_decay", *spec.params} <= set(sig), spec.name  # torch takes what we pass
    for key, value in spec.defaults.items():
        assert sig[key].default == value, (spec.name, key)
    for hyper in ({}, {k: v for k, v in ALL_ON.items() if k in spec.params}):
        p = torch.nn.Parameter(torch.randn(4, 3))
        opt = cls([p], lr=1e-2, foreach=True, **hyper)
        p.grad = torch.randn(4, 3)
        opt.step()
        state = opt.state[p]
        per_element = {k for k, v in state.items() if v.shape == p.shape}
        scalar = {k for k, v in state.items() if v.dim() == 0}
        assert per_element == set(spec.state_names(hyper)), (spec.name, hyper)
        assert scalar == ({"step"} if spec.has_step else set()) | {n for n, _ in spec.scalars}, spec.name
        for name in NON_NEGATIVE.keys() & per_element:
            assert bool((state[name] >= 0).all()), name


def test_fused_devices_run_on_the_cpu():
    for spec in SPECS.values():
        if spec.fused is None or "cpu" in spec.fused:
            p = torch.nn.Parameter(torch.randn(3))
            opt = getattr(torch.optim, spec.torch_class)([p], lr=1e-2, fused=True)
            p.grad = torch.randn(3)
            opt.step()
        else:
            with pytest.raises((TypeError, RuntimeError)):
                getattr(torch.optim, spec.torch_class)([torch.nn.Parameter(torch.randn(3))], fused=True)


def test_names_case_and_refused_ones():
    assert spec_for("ADAMW") is spec_for("adam") is SPECS["adamw"] and ALIASES == {"adam": "adamw"}
    assert spec_for("rmsprop").name == "RMSprop"
    for name in ("LBFGS", "SparseAdam", "Adafactor"):
        assert name.lower() in REFUSED
        with pytest.raises(ValueError, match="cannot run on flat shards; expected one of Adam, AdamW, SGD"):
            spec_for(name)
    with pytest.raises(ValueError, match="expected one of"):
        spec_for("Lion")


def _load(tmp_path, text: str):
    path = tmp_path / "c.yml"
    path.write_text(text)
    return load_neox_config([str(path)]), str(path)


def test_block_reads_type_and_hyperparameters(tmp_path):
    args, _ = _load(tmp_path, "optimizer: {type: sgd, params: {lr: 0.1, momentum: 0.9, nesterov: true}}\n")
    assert args.optim.optimizer.type == "SGD" and args.optim.lr == pytest.approx(0.1)
    assert args.optim.optimizer.hyperparameters() == {"momentum": 0.9, "nesterov": True}  # no betas, no eps
    assert args.optim.optimizer.state_names() == ("momentum_buffer",)
    adam, _ = _load(tmp_path, "optimizer: {type: adam, params: {lr: 1.0e-3, amsgrad: true}}\n")
    assert adam.optim.optimizer.type == "Adam"
    # betas not given: NeoX's Adam takes torch's (0.9, 0.999)
    assert adam.optim.optimizer.hyperparameters() == {"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": True}
    assert adam.optim.optimizer.state_names() == ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    # the run's config.yml round trip: the block is written back in the form it is read
    block = to_neox_dict(args)["optimizer"]
    assert block == {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}
    again, _ = _load(tmp_path, f"optimizer: {block}\n")
    assert again.optim.optimizer == args.optim.optimizer


@pytest.mark.parametrize(
    "block, key, fragment",
    [
        ("{type: LBFGS}", "optimizer.type", "LBFGS keeps whole-model history"),
        ("{type: Lion}", "optimizer.type", "expected one of Adam, AdamW, SGD, Adagrad"),
        ("{type: SGD, params: {betas: [0.9, 0.99]}}", "optimizer.params.betas", "SGD takes no 'betas'"),
        ("{type: RMSprop, params: {nesterov: true}}", "optimizer.params.nesterov", "RMSprop takes no"),
        ("{type: Adam, params: {momentum: 0.9}}", "optimizer.params.momentum", "AdamW takes no 'momentum'"),
        ("{type: SGD, params: {momentum: -0.5}}", "optimizer.params.momentum", "-0.5: expected a number in"),
        ("{type: SGD, params: {nesterov: true}}", "optimizer.params.nesterov", "nesterov needs momentum > 0"),
        ("{type: Adagrad, params: {lr_decay: -1}}", "optimizer.params.lr_decay", "expected a number in"),
        ("{type: RMSprop, params: {centered: maybe}}", "optimizer.params.centered", "true or false"),
    ],
)
def test_block_errors_name_the_key(tmp_path, block, key, fragment):
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, f"optimizer: {block}\n")
    assert exc.value.key == key and fragment in str(exc.value)
    assert str(tmp_path / "c.yml") in str(exc.value)


def test_plan_prices_the_configured_optimizers_states(tmp_path):
    # zerotopo plan reads optimizer.type as the pre-flight check does: SGD with momentum keeps the fp32
    # master and one state (8 bytes a parameter), AdamW two states (12)
    import argparse

    import yaml

    from zerotopo.cli import plan as plan_cli
    from zerotopo.config.model_files import resolve_model_paths

    (tiny,) = resolve_model_paths(["tiny"])
    config = yaml.safe_load(Path(tiny).read_text())
    config["optimizer"] = {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}
    sgd = tmp_path / "sgd.yml"
    sgd.write_text(yaml.safe_dump(config))

    def optim_bytes(*models: str) -> int:
        parser = argparse.ArgumentParser()
        plan_cli.add_arguments(parser)
        args = parser.parse_args(
            ["--model", *models, "--topology", "frontier", "--nodes", "2", "--plans", "zero3"]
        )
        (est,), *_ = plan_cli.estimates(args)
        return est.memory.optim

    adamw = optim_bytes("tiny")
    assert optim_bytes(str(sgd)) * 12 == adamw * 8
