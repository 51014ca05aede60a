"""Llama-architecture models through ``zerotopo train`` on emulated gloo ranks: GPT-NeoX's own llama configs
shrunk with ``--set`` (SentencePiece tokenizer, grouped-query heads), and a Hugging Face Llama with
grouped-query attention imported, trained, exported and compared with transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from zerotopo.cli.main import main
from zerotopo.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "tests" / "fixtures" / "neox" / "llama"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Grouped-query attention shares keys and values between heads.",
    "Sharded data parallelism follows the machine's bandwidth tiers.",
    "RMSNorm scales by the root mean square and has no offset here.",
]


def sets(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def train_losses(run: Path) -> dict[int, float]:
    return {int(r["step"]): r["loss"] for r in read_metrics(run / "metrics.csv") if r["kind"] == "train"}


def test_neox_llama_configs_train_when_shrunk(tmp_path, capfd):
    """NeoX's llama/7B.yml + llama/train_config.yml, given a tokenizer.model and data, train 2 steps on 4
    ranks with every architecture key honoured (no key reported as ignored)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 4) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "tokenizer"), vocab_size=100, model_type="bpe",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    model_file = tmp_path / "tokenizer.model"
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"{t} {i}"}) + "\n" for i in range(60) for t in TEXTS))
    prefix = tmp_path / "data" / "llama"
    assert main(["data", "preprocess", "--input", str(docs), "--output-prefix", str(prefix),
                 "--tokenizer-type", "SPMTokenizer", "--vocab-file", str(model_file), "--append-eod"]) == 0  # fmt: skip
    shrink = {
        "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "seq_length": 32,
        "max_position_embeddings": 32, "train_iters": 2, "lr_decay_iters": 2, "eval_iters": 0,
        "log_interval": 1, "fp16.enabled": False, "intermediate_size": 512, "tokenizer_type": "SPMTokenizer",
        "vocab_file": str(model_file),
        "data_path": f"{prefix}_text_document", "topology": "emulated-4node", "save": str(tmp_path / "save"),
    }  # fmt: skip
    run = tmp_path / "run"
    code = main(
        ["train", str(LLAMA / "7B.yml"), str(LLAMA / "train_config.yml"), "--nodes", "2", "--run-dir", str(run),
         "--no-progress", *sets(shrink)]
    )  # fmt: skip
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    assert "ignored" not in out + err
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert saved["norm"] == "rmsnorm" and saved["activation"] == "swiglu" and saved["num_kv_heads"] == 2
    assert saved["override_lr_scheduler"] is True and saved["finetune"] is True
    losses = train_losses(run)
    assert sorted(losses) == [1, 2] and all(0 < v < 10 for v in losses.values())
    # exported as LlamaForCausalLM with the SentencePiece model as tokenizer.model, </s> as end-of-document
    from zerotopo.checkpoint.hf import export_hf

    export_hf(tmp_path / "save", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    # NeoX's swiglu MLP: two thirds of 512, halved between gate and up (170), rounded up to 256
    assert config["eos_token_id"] == 2 and config["intermediate_size"] == 256
    assert (tmp_path / "hf" / "tokenizer.model").read_bytes() == model_file.read_bytes()
    tokenizer_config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "LlamaTokenizer" and tokenizer_config["eos_token"] == "</s>"


def hf_llama_gqa(directory: Path):
    cfg = transformers.LlamaConfig(
        vocab_size=384, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(5)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model.save_pretrained(directory, max_shard_size="60KB")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def checkpoint_model(save: Path):
    """The zerotopo model a checkpoint holds, assembled in this process."""
    from zerotopo.checkpoint.store import find_checkpoint, read_tensors
    from zerotopo.models.neox import GPTNeoX, NeoXConfig

    step = find_checkpoint(save)
    manifest = json.loads((step / "checkpoint.json").read_text())
    shapes = manifest["parameters"]
    flat = read_tensors(step, {f"param/{n}": (torch.Size(s).numel(),) for n, s in shapes.items()})
    model = GPTNeoX(NeoXConfig(**manifest["model"]))
    model.load_state_dict({n: flat[f"param/{n}"].reshape(s) for n, s in shapes.items()})
    return model.eval()


def test_hf_llama_gqa_imported_trained_exported_matches_transformers(tmp_path, capfd):
    from zerotopo.checkpoint.hf import export_hf

    src = tmp_path / "hf-in"
    before = hf_llama_gqa(src)
    cfg = tmp_path / "run.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "seq_length": 32,
                "train_micro_batch_size_per_gpu": 1,
                "train_iters": 2,
                "eval_iters": 0,
                "log_interval": 1,
                "precision": "fp32",
                "tokenizer_type": "ByteTokenizer",
                "topology": "emulated-4node",
                "plan": "zero3",
                "save": str(tmp_path / "save"),
                "optimizer": {"type": "AdamW", "params": {"lr": 1.0e-3}},
            }  # fmt: skip
        )
    )
    run = tmp_path / "run"
    code = main(
        ["train", str(cfg), "--nodes", "2", "--from-hf", str(src), "--run-dir", str(run), "--no-progress"]
    )
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    assert "weights from the Hugging Face model" in (run / "train.log").read_text()
    out_dir = tmp_path / "hf-out"
    files = export_hf(tmp_path / "save", out_dir, max_shard_bytes=40_000)
    assert any(f.name == "model.safetensors.index.json" for f in files)
    assert json.loads((out_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    exported = transformers.LlamaForCausalLM.from_pretrained(out_dir).eval()
    assert exported.config.num_key_value_heads == 2
    trained = exported.state_dict()["model.layers.0.self_attn.k_proj.weight"]
    assert not torch.equal(trained, before["model.layers.0.self_attn.k_proj.weight"])  # it trained
    ours = checkpoint_model(tmp_path / "save")
    ids = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), exported(ids).logits, rtol=0, atol=1e-5)
