"""Hugging Face directories in and out: config.json of both transformers generations, sharded safetensors
with an index read by slice, and ``export-hf`` from sharded checkpoints loading in transformers."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from zerotopo.checkpoint.hf import (
    INDEX_FILE,
    HFWeights,
    check_hf_directory,
    export_hf,
    hf_to_neox_config,
    merge_hf_config,
)
from zerotopo.errors import ZerotopoError
from zerotopo.models.hf import hf_segments
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.sizes import parse_size

pytestmark = pytest.mark.slow  # a module fixture trains and saves a checkpoint on spawned ranks

V4 = {  # transformers < 5 writes rotary_pct / rotary_emb_base
    "model_type": "gpt_neox", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 2, "intermediate_size": 48, "rotary_pct": 0.5, "rotary_emb_base": 5000,
    "max_position_embeddings": 32, "use_parallel_residual": False, "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_new", "tie_word_embeddings": False, "attention_bias": True,
}  # fmt: skip
V5 = {k: v for k, v in V4.items() if k not in ("rotary_pct", "rotary_emb_base")}
V5["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5}


def test_config_of_both_transformers_generations():
    a, b = hf_to_neox_config(V4), hf_to_neox_config(V5)
    assert a == b
    assert (a.rotary_pct, a.rotary_emb_base, a.gpt_j_residual, a.gelu_approximate) == (0.5, 5000, False, True)
    assert a.ffn_size == 48 and a.layernorm_epsilon == 1e-6


def test_config_errors_name_the_field():
    with pytest.raises(ZerotopoError, match="missing 'hidden_size'"):
        hf_to_neox_config({k: v for k, v in V4.items() if k != "hidden_size"})
    with pytest.raises(ZerotopoError, match="hidden_act 'relu'"):
        hf_to_neox_config({**V4, "hidden_act": "relu"})


class _Args:
    def __init__(self, sources):
        self.sources = sources


def test_architecture_mismatch_is_refused_with_the_difference_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(V5))
    run = NeoXConfig(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=2, gpt_j_residual=True)
    with pytest.raises(
        ZerotopoError, match="gpt_j_residual: True in my.yml, the model has use_parallel_residual"
    ):
        merge_hf_config(tmp_path, _Args({"gpt_j_residual": "my.yml"}), run)
    # keys the config does not set come from config.json
    merged = merge_hf_config(tmp_path, _Args({}), run)
    assert merged.gpt_j_residual is False and merged.ffn_size == 48


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size(1000) == 1000
    with pytest.raises(ZerotopoError):
        parse_size("lots")


@pytest.fixture(scope="module")
def hf_sharded(tmp_path_factory):
    """A random transformers GPT-NeoX saved in several safetensors shards with an index."""
    transformers = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(**{k: v for k, v in V5.items() if k != "model_type"})
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    model.save_pretrained(d, max_shard_size="20KB", safe_serialization=True)
    return d, model


def test_sharded_directory_reads_by_slice(hf_sharded):
    d, model = hf_sharded
    assert (d / INDEX_FILE).is_file() and len(list(d.glob("model-*.safetensors"))) > 1
    cfg = hf_to_neox_config(json.loads((d / "config.json").read_text()))
    weights = check_hf_directory(d, cfg)
    sd = model.state_dict()
    for name in ("gpt_neox.embed_in.weight", "gpt_neox.layers.1.attention.query_key_value.weight",
                 "gpt_neox.layers.0.input_layernorm.bias"):  # fmt: skip
        flat = sd[name].reshape(-1)
        for a, b in ((0, flat.numel()), (5, 37), (flat.numel() - 3, flat.numel())):
            assert torch.equal(weights.read_flat(name, a, b), flat[a:b])


def test_wrong_directory_is_refused(hf_sharded, tmp_path):
    d, _ = hf_sharded
    cfg = hf_to_neox_config(V5)
    with pytest.raises(ZerotopoError, match="does not hold this GPT-NeoX model"):
        check_hf_directory(d, NeoXConfig(**{**asdict(cfg), "num_layers": 3}))
    with pytest.raises(ZerotopoError, match="has shape"):
        check_hf_directory(d, NeoXConfig(**{**asdict(cfg), "vocab_size": 80}))
    with pytest.raises(ZerotopoError, match="no .safetensors file"):
        HFWeights(tmp_path)


# -- export from a sharded checkpoint -----------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 2-rank zero3 checkpoint of the tiny model of ckpt_workers, with a Hugging Face tokenizer."""
    tokenizers = pytest.importorskip("tokenizers")
    from tests.trainer.ckpt_workers import checkpoint_worker
    from zerotopo.launch.spawn import spawn

    d = tmp_path_factory.mktemp("export")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<|endoftext|>"])
    tok.train_from_iterator(["hello world", "the sharded checkpoint", "zerotopo trains models"] * 5, trainer)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))
    info = {
        "type": "HFTokenizer",
        "eod": tok.token_to_id("<|endoftext|>"),
        "files": [str(d / "tokenizer.json")],
    }
    spawn(
        checkpoint_worker,
        2,
        args=(str(d / "save"), "zero3", 1, 2, None, False, info),
        ranks_per_node=2,
        timeout_s=900,
    )
    return d


def _reference_logits(step_dir, cfg, x):
    """Logits of zerotopo's own model with the weights assembled straight from the DCP shards."""
    from zerotopo.checkpoint.store import parameter_shapes, read_tensors

    shapes = parameter_shapes(cfg)
    flat = read_tensors(step_dir, {f"param/{n}": (torch.Size(s).numel(),) for n, s in shapes.items()})
    model = GPTNeoX(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(flat[f"param/{n}"].reshape(p.shape))
        return model(x), flat


def test_export_loads_in_transformers_with_equal_logits(checkpoint):
    transformers = pytest.importorskip("transformers")
    from tests.trainer.ckpt_workers import cfg as tiny_cfg

    out = checkpoint / "hf-out"
    files = export_hf(checkpoint / "save", out, max_shard_bytes=12_000)
    names = [f.name for f in files]
    assert INDEX_FILE in names and "model-00001-of-" in " ".join(names) and "tokenizer.json" in names
    index = json.loads((out / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1
    config = json.loads((out / "config.json").read_text())
    eod = json.loads((checkpoint / "save" / "step_2" / "checkpoint.json").read_text())["tokenizer"]["eod"]
    assert config["bos_token_id"] == config["eos_token_id"] == eod

    hf = transformers.GPTNeoXForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    ref, flat = _reference_logits(checkpoint / "save" / "step_2", tiny_cfg(), x)
    with torch.no_grad():
        got = hf(x).logits
    assert (got - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
    # fp32 export: the tensors are the master weights exactly
    sd = dict(hf.named_parameters(remove_duplicate=False))
    sd.setdefault("embed_out.weight", sd.get("lm_head.weight"))  # transformers >= 5 renames it on load
    for n, t in flat.items():
        ((hf_name, _, _),) = hf_segments(tiny_cfg(), n.removeprefix("param/"), t.numel())
        assert torch.equal(sd[hf_name].detach().reshape(-1), t)

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|endoftext|>"
    ids = tokenizer("hello world", return_tensors="pt").input_ids
    gen = hf.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=eod)
    assert ids.shape[1] < gen.shape[1] <= ids.shape[1] + 3


def test_export_never_overwrites(checkpoint, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ZerotopoError, match="not empty"):
        export_hf(checkpoint / "save", out)
    assert (out / "keep.txt").read_text() == "mine"
    single = export_hf(checkpoint / "save", tmp_path / "one")
    assert [f.name for f in single if f.suffix == ".safetensors"] == ["model.safetensors"]


def test_export_cli(checkpoint, tmp_path, capsys):
    from zerotopo.cli.main import main

    assert (
        main(["export-hf", str(checkpoint / "save" / "step_2"), str(tmp_path / "o"), "--dtype", "bf16"]) == 0
    )
    assert "model.safetensors" in capsys.readouterr().out
    from safetensors import safe_open

    with safe_open(str(tmp_path / "o" / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("embed_out.weight").dtype == torch.bfloat16
    assert main(["export-hf", str(tmp_path / "nothing"), str(tmp_path / "o2")]) == 2
