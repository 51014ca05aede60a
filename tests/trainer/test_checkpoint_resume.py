"""Sharded checkpoints end to end through ``zerotopo train`` on 8 emulated ranks (4 nodes x 2):
a save killed midway resumes from the previous complete checkpoint, resume is bit-exact, and a
checkpoint written by 8 ranks continues under other plans and world sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.trainer.save_faults import FAULT_ENV, inject_save_fault
from zerotopo.checkpoint.store import find_checkpoint
from zerotopo.cli.main import main
from zerotopo.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# zerotopo's layout (weights per package, gradients per node, optimizer over the job) without int8/int4
# communication, so continuations under other plans are comparable to 1e-5.
EXACT_ZEROTOPO = "params=inner,grads=node,optim=world"


def small_config(path: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yml").read_text())
    cfg.update(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        seq_length=32,
        max_position_embeddings=32,
        train_micro_batch_size_per_gpu=1,
        gradient_accumulation_steps=1,
        train_iters=6,
        eval_interval=100,
        eval_iters=0,
        log_interval=1,
        topology="emulated-4node",
    )
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(tmp: Path, name: str, *extra: str, capfd) -> tuple[int, str, Path]:
    run = tmp / f"run-{name}"
    code = main(["train", str(tmp / "small.yml"), "--run-dir", str(run), "--no-progress", *extra])
    out, err = capfd.readouterr()
    return code, out + err, run


def losses(run: Path) -> dict[int, float]:
    return {int(r["step"]): r["loss"] for r in read_metrics(run / "metrics.csv") if r["kind"] == "train"}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    small_config(d / "small.yml")
    return d


@pytest.fixture(scope="module")
def reference(tmp):
    """8 ranks, 6 steps, a checkpoint every 2 steps."""
    save = tmp / "ref"
    code = main(
        ["train", str(tmp / "small.yml"), "--plan", EXACT_ZEROTOPO, "--run-dir", str(tmp / "run-ref"),
         "--no-progress", "--set", f"save={save}", "--set", "save_interval=2"]
    )  # fmt: skip
    assert code == 0
    return save, losses(tmp / "run-ref")


def test_checkpoint_layout(reference):
    save, _ = reference
    assert (save / "latest").read_text().strip() == "step_6"
    step = save / "step_4"
    manifest = json.loads((step / "checkpoint.json").read_text())
    assert manifest["step"] == 4 and manifest["world_size"] == 8 and manifest["consumed_samples"] == 32
    # every rank wrote its own file; no .metadata pickle, no hidden temporary directories left
    assert sorted(p.name for p in step.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(8)]
    assert not (step / ".metadata").exists() and (step / "dcp_metadata.json").is_file()
    assert not list(save.glob(".step_*"))
    md = json.loads((step / "dcp_metadata.json").read_text())
    # each parameter is stored as 1-D pieces: the embedding spans several ranks' optimizer chunks
    chunks = md["tensors"]["param/embed_in.weight"]["chunks"]
    assert (
        len(chunks) > 1
        and sum(c["sizes"][0] for c in chunks) == md["tensors"]["param/embed_in.weight"]["size"][0]
    )


def test_killed_save_resumes_from_previous_checkpoint_bit_exact(tmp, reference, capfd, monkeypatch):
    _, ref = reference
    save = tmp / "fault-write"
    inject_save_fault(monkeypatch, "4:write")  # rank 0 dies once its shards of step 4 are on disk
    code, text, _ = train(
        tmp, "fault-write", "--plan", EXACT_ZEROTOPO, "--set", f"save={save}", "--set", "save_interval=2",
        capfd=capfd,
    )  # fmt: skip
    assert code != 0 and "rank 0 of 8 exited with signal 9" in text, text
    assert (save / "latest").read_text().strip() == "step_2"
    assert not (save / "step_4").exists() and list(save.glob(".step_4.tmp-*"))  # the partial save is hidden
    monkeypatch.delenv(FAULT_ENV)
    code, text, run = train(
        tmp, "resume", "--plan", EXACT_ZEROTOPO, "--set", f"load={save}", "--set", f"save={save}",
        "--set", "save_interval=2", capfd=capfd,
    )  # fmt: skip
    assert code == 0, text
    assert "resumed from" in (run / "train.log").read_text() and "step_2" in (run / "train.log").read_text()
    got = losses(run)
    assert sorted(got) == [3, 4, 5, 6]
    assert all(got[s] == ref[s] for s in got), (got, ref)  # bit for bit
    assert (save / "latest").read_text().strip() == "step_6" and not list(save.glob(".step_*"))


def test_kill_after_rename_leaves_latest_on_previous(tmp, capfd, monkeypatch):
    save = tmp / "fault-rename"
    inject_save_fault(monkeypatch, "4:rename")  # rank 0 dies after step_4 is in place, before latest moves
    code, text, _ = train(
        tmp, "fault-rename", "--plan", EXACT_ZEROTOPO, "--set", "train_iters=4", "--set", f"save={save}",
        "--set", "save_interval=2", capfd=capfd,
    )  # fmt: skip
    assert code != 0
    assert (save / "step_4" / "checkpoint.json").is_file()
    assert (save / "latest").read_text().strip() == "step_2"
    assert find_checkpoint(save) == save / "step_2"


@pytest.mark.parametrize(
    "name,flags",
    [
        ("zero3-4ranks", ["--plan", "zero3", "--nodes", "2", "--set", "gradient_accumulation_steps=2"]),
        ("hsdp-8ranks", ["--plan", "hsdp"]),
    ],
)
def test_reshard_continues_within_1e5(tmp, reference, capfd, name, flags):
    save, ref = reference
    code, text, run = train(tmp, name, *flags, "--set", f"load={save / 'step_4'}", capfd=capfd)
    assert code == 0, text
    got = losses(run)
    assert sorted(got) == [5, 6]
    for s in got:
        assert abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]), (s, got[s], ref[s])


def test_an_8_rank_checkpoint_resumes_on_4_ranks_at_half_the_global_batch(tmp, reference, capfd):
    save, _ = reference
    # step 4 of 6 consumed 32 samples at 8 per step; 4 ranks run the 2 steps left at 4 per step
    code, text, run = train(tmp, "4ranks", "--nodes", "2", "--set", f"load={save / 'step_4'}", capfd=capfd)
    assert code == 0, text
    assert "damaged" not in text
    assert sorted(losses(run)) == [5, 6]
    assert "training continues from sample 32 with 4 samples per step" in (run / "train.log").read_text()


@pytest.fixture(scope="module")
def hf_model(tmp):
    """A random transformers GPT-NeoX of the small config's shape, in several safetensors shards."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(1)
    cfg = transformers.GPTNeoXConfig(
        vocab_size=384, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=32, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.GPTNeoXForCausalLM(cfg)
    d = tmp / "hf-in"
    model.save_pretrained(d, max_shard_size="60KB")
    assert (d / "model.safetensors.index.json").is_file()
    return d, {k: v.detach().clone() for k, v in model.named_parameters()}


def test_from_hf_starts_from_the_model_weights(tmp, hf_model, capfd):
    import torch
    from safetensors.torch import load_file

    from zerotopo.checkpoint.hf import export_hf

    src, params = hf_model
    save = tmp / "from-hf"
    # a learning rate of 1e-30 leaves the weights as loaded (below fp32 resolution except at zeros)
    code, text, run = train(
        tmp, "from-hf", "--nodes", "2", "--plan", "zero3", "--from-hf", str(src), "--set", "train_iters=1",
        "--set", "optimizer.params.lr=1e-30", "--set", "min_lr=0", "--set", "weight_decay=0",
        "--set", f"save={save}", capfd=capfd,
    )  # fmt: skip
    assert code == 0, text
    # the run's own log (ranks' console lines may reach an outer capture when the suite runs as a whole)
    assert "weights from the Hugging Face model" in (run / "train.log").read_text()
    assert losses(run)[1] > 0
    out = export_hf(save, tmp / "from-hf-export")
    got = {}
    for f in out:
        if f.suffix == ".safetensors":
            got.update(load_file(f))
    params.setdefault("embed_out.weight", params.get("lm_head.weight"))
    for name, t in got.items():
        # zero biases move by the 1e-30 step; every other element is the model's own value
        assert torch.allclose(t, params[name], rtol=0, atol=1e-29), name


def test_from_hf_refuses_another_architecture(tmp, hf_model, capfd):
    src, _ = hf_model
    code, text, _ = train(
        tmp,
        "from-hf-bad",
        "--nodes",
        "2",
        "--from-hf",
        str(src),
        "--set",
        "gpt_j_residual=false",
        capfd=capfd,
    )
    assert code == 2
    assert "gpt_j_residual: False in --set, the model has use_parallel_residual = True" in text, text
