"""An OLMo-2 model (QK-norm, norms after attention and MLP) from Hugging Face through ``zerotopo train
--from-hf`` on 8 emulated gloo ranks, exported with ``export-hf`` and compared with transformers."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.models.test_hf_families_train import checkpoint_model
from tests.models.test_olmo2 import save_random
from zerotopo.cli.main import main

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


def test_olmo2_imported_trained_exported_matches_transformers(tmp_path, capfd):
    from zerotopo.checkpoint.hf import export_hf

    src = tmp_path / "hf-in"
    before = {k: v.clone() for k, v in save_random(src, vocab_size=384).state_dict().items()}
    cfg = tmp_path / "run.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "seq_length": 32,
                "train_micro_batch_size_per_gpu": 1,
                "train_iters": 3,
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
    run = tmp_path / "run"
    code = main(
        ["train", str(cfg), "--nodes", "2", "--from-hf", str(src), "--run-dir", str(run), "--no-progress"]
    )
    out, err = capfd.readouterr()
    assert code == 0, (out + err)[-3000:]
    out_dir = tmp_path / "hf-out"
    export_hf(tmp_path / "save", out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    assert config["architectures"] == ["Olmo2ForCausalLM"]
    exported = transformers.Olmo2ForCausalLM.from_pretrained(out_dir).eval()
    sd = exported.state_dict()
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight"):
        assert not torch.equal(sd[name], before[name]), name  # it trained, the QK-norm too
    ours = checkpoint_model(tmp_path / "save")
    assert ours.config.qk_norm and ours.config.post_norm
    ids = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), exported(ids).logits, rtol=0, atol=1e-5)
