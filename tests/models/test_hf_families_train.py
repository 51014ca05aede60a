"""Llama-3.2-style (tied embeddings, llama3 rope), Qwen2-style (q/k/v biases, tied) and Mistral-style
(sliding window shorter than the sequence) Hugging Face models through ``zerotopo train --from-hf`` on 8
emulated gloo ranks, exported with ``export-hf`` and compared with transformers."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.models.test_hf_families import FAMILIES, save_random
from zerotopo.cli.main import main

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


def checkpoint_model(save):
    """The zerotopo model a checkpoint holds (a tied head is the embedding: stored once)."""
    from zerotopo.checkpoint.store import find_checkpoint, read_tensors
    from zerotopo.models.neox import GPTNeoX, NeoXConfig

    step = find_checkpoint(save)
    manifest = json.loads((step / "checkpoint.json").read_text())
    shapes = manifest["parameters"]
    flat = read_tensors(step, {f"param/{n}": (torch.Size(s).numel(),) for n, s in shapes.items()})
    model = GPTNeoX(NeoXConfig(**manifest["model"]))
    missing, unexpected = model.load_state_dict(
        {n: flat[f"param/{n}"].reshape(s) for n, s in shapes.items()}, strict=False
    )
    assert not unexpected and missing == (["head.embed_out.weight"] if model.config.tie_embeddings else [])
    return model.eval()


def train_and_export(tmp_path, capfd, src, *, plan: str, iters: int):
    """``zerotopo train --from-hf src`` for ``iters`` steps under ``plan`` on 2 emulated nodes (8 ranks),
    then ``export-hf`` of its checkpoint; returns the exported directory."""
    from zerotopo.checkpoint.hf import export_hf

    cfg = tmp_path / "run.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "seq_length": 32,  # the Mistral model's window is 8
                "train_micro_batch_size_per_gpu": 1,
                "train_iters": iters,
                "eval_iters": 0,
                "log_interval": 1,
                "precision": "fp32",
                "tokenizer_type": "ByteTokenizer",
                "topology": "emulated-4node",
                "plan": plan,
                "save": str(tmp_path / "save"),
                "optimizer": {"type": "AdamW", "params": {"lr": 1.0e-3}},
            }
        )
    )
    run = tmp_path / "run"
    code = main(
        ["train", str(cfg), "--nodes", "2", "--from-hf", str(src), "--run-dir", str(run), "--no-progress"]
    )
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    out_dir = tmp_path / "hf-out"
    export_hf(tmp_path / "save", out_dir)
    return out_dir


@pytest.mark.parametrize("family,plan", [("llama3.2", "zero3"), ("qwen2", "mics"), ("mistral", "zerotopo")])
def test_imported_trained_exported_matches_transformers(tmp_path, capfd, family, plan):
    src = tmp_path / "hf-in"
    before = {k: v.clone() for k, v in save_random(src, family, vocab_size=384).state_dict().items()}
    out_dir = train_and_export(tmp_path, capfd, src, plan=plan, iters=2)
    config = json.loads((out_dir / "config.json").read_text())
    cls = FAMILIES[family]()[1]
    assert config["architectures"] == [cls.__name__]
    exported = cls.from_pretrained(out_dir).eval()
    sd = exported.state_dict()
    name = "model.embed_tokens.weight"
    assert not torch.equal(sd[name], before[name])  # it trained
    ours = checkpoint_model(tmp_path / "save")
    assert ours.config.tie_embeddings == config["tie_word_embeddings"]
    if ours.config.tie_embeddings:  # exported tied: one matrix, the head reads the trained embedding
        assert torch.equal(sd["lm_head.weight"], sd[name])
    ids = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), exported(ids).logits, rtol=0, atol=1e-5)


def test_neox_config_with_tied_embeddings_trains_and_exports_tied(tmp_path, capfd):
    """``no_weight_tying: false`` in a NeoX config: trained on 8 ranks under the zerotopo plan, exported
    as a tied GPTNeoXForCausalLM with the checkpoint's logits."""
    from zerotopo.checkpoint.hf import export_hf

    cfg = tmp_path / "run.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "num_layers": 2,
                "hidden_size": 32,
                "num_attention_heads": 4,
                "no_weight_tying": False,
                "seq_length": 32,
                "max_position_embeddings": 32,
                "train_micro_batch_size_per_gpu": 1,
                "train_iters": 2,
                "eval_iters": 0,
                "log_interval": 1,
                "precision": "fp32",
                "tokenizer_type": "ByteTokenizer",
                "topology": "emulated-4node",
                "plan": "zerotopo",
                "save": str(tmp_path / "save"),
                "optimizer": {"type": "AdamW", "params": {"lr": 1.0e-3}},
            }
        )
    )
    code = main(["train", str(cfg), "--nodes", "2", "--run-dir", str(tmp_path / "run"), "--no-progress"])
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    export_hf(tmp_path / "save", tmp_path / "hf-out")
    config = json.loads((tmp_path / "hf-out" / "config.json").read_text())
    assert config["architectures"] == ["GPTNeoXForCausalLM"] and config["tie_word_embeddings"] is True
    exported = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path / "hf-out").eval()
    ours = checkpoint_model(tmp_path / "save")
    ids = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), exported(ids).logits, rtol=0, atol=1e-5)
