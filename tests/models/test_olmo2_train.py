"""An OLMo-2 model (QK-norm, norms after attention and MLP) from Hugging Face through ``zerotopo train
--from-hf`` on 8 emulated gloo ranks, exported with ``export-hf`` and compared with transformers."""

from __future__ import annotations

import json

import pytest
import torch

from tests.models.test_hf_families_train import checkpoint_model, train_and_export
from tests.models.test_olmo2 import save_random

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


def test_olmo2_imported_trained_exported_matches_transformers(tmp_path, capfd):
    src = tmp_path / "hf-in"
    before = {k: v.clone() for k, v in save_random(src, vocab_size=384).state_dict().items()}
    out_dir = train_and_export(tmp_path, capfd, src, plan="zerotopo", iters=3)
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
