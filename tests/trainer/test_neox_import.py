"""A GPT-NeoX checkpoint directory, laid out as NeoX (DeepSpeed's pipeline engine) writes one, loads as
initial weights (``finetune`` semantics) through ``zerotopo train``; a zerotopo checkpoint exports to one
safetensors file and to a DCP directory that stock torch tools read; ``finetune: true`` on a zerotopo
checkpoint loads weights only; and a resume under another global batch continues from the consumed samples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zerotopo.checkpoint.neox import check_neox_checkpoint, neox_step_dir
from zerotopo.config.neox import load_neox_config
from zerotopo.data.tokenizers import build_tokenizer
from zerotopo.errors import ZerotopoError
from zerotopo.models.neox import GPTNeoX
from zerotopo.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]

MODEL = (
    "num_layers: 2\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\nmax_position_embeddings: 16\n"
    "tokenizer_type: ByteTokenizer\ntrain_micro_batch_size_per_gpu: 2\nprecision: fp32\nplan: zero3\n"
    "log_interval: 1\neval_interval: 100\neval_iters: 1\nsplit: '98,2,0'\n"
)
TOPOLOGY = """name: two-ranks
nodes: 1
device: {name: CPU rank (gloo), memory_gib: 2, host_reduce: true, peak_tflops: 0.05}
tiers: [{name: package, fanout: 2, bandwidth_gbps: 4.0, latency_us: 20}]
network: {name: network, injection_gbps: 2.0, latency_us: 100}
"""


def _neox_layer_states(model: GPTNeoX) -> dict[int, dict[str, torch.Tensor]]:
    """The model's weights as NeoX's pipeline layers hold them (numbering and names of GPT-NeoX: with
    ``norm: rmsnorm`` its RMSNorm's gain is ``scale`` and its bias ``offset``)."""
    n = model.config.num_layers
    layers: dict[int, dict[str, torch.Tensor]] = {0: {}, n + 3: {}, n + 4: {}}
    rms = {"weight": "scale", "bias": "offset"} if model.config.norm == "rmsnorm" else {}
    for name, t in model.state_dict().items():
        t = t.detach().clone()
        module, _, leaf = name.rpartition(".")
        if module.endswith("norm"):
            name = f"{module}.{rms.get(leaf, leaf)}"
        if name == "embed_in.weight":
            layers[0]["word_embeddings.weight"] = t
        elif name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            layers.setdefault(int(i) + 2, {})[rest] = t
        elif name.startswith("head.final_layer_norm."):
            layers[n + 3]["norm." + name.rsplit(".", 1)[1]] = t
        elif name == "head.embed_out.weight":
            layers[n + 4]["final_linear.weight"] = t
    for i in range(n):  # NeoX keeps the rotary frequencies as a buffer in each layer's file
        layers[i + 2]["attention.rotary_emb.inv_freq"] = torch.ones(4)
    return layers


def write_neox_checkpoint(model: GPTNeoX, save: Path, step: int) -> Path:
    """``save/global_step<step>/`` as DeepSpeed's PipelineEngine writes it, and ``save/latest``."""
    step_dir = save / f"global_step{step}"
    step_dir.mkdir(parents=True)
    for idx, state in _neox_layer_states(model).items():
        torch.save(state, step_dir / f"layer_{idx:02d}-model_00-model_states.pt")
    torch.save(
        {"module": None, "dp_world_size": 1, "mp_world_size": 1, "global_steps": step, "iteration": step},
        step_dir / "mp_rank_00_model_states.pt",
    )
    (save / "latest").write_text(f"global_step{step}")
    return step_dir


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("neox_import")
    (work / "model.yml").write_text(MODEL)
    (work / "two.yaml").write_text(TOPOLOGY)
    args = load_neox_config([work / "model.yml"])
    cfg = args.model.model_config(build_tokenizer("ByteTokenizer", None, None).vocab_size)
    torch.manual_seed(7)
    model = GPTNeoX(cfg)
    write_neox_checkpoint(model, work / "neox", step=2)
    return work, model, cfg


def _run(argv: list[str], cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "zerotopo", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _train(work: Path, *sets: str, run: str) -> subprocess.CompletedProcess:
    argv = ["train", "model.yml", "--topology", "two.yaml", "--no-progress", "--run-dir", run]
    return _run([*argv, *(a for s in sets for a in ("--set", s))], work)


def test_neox_directory_is_recognised_and_checked(work):
    work, model, cfg = work
    step_dir = neox_step_dir(work / "neox")
    assert step_dir == work / "neox" / "global_step2"
    weights = check_neox_checkpoint(step_dir, cfg)
    for name, t in model.state_dict().items():
        assert torch.equal(weights[name], t), name


def test_a_pickled_object_in_a_layer_file_is_refused_not_run(tmp_path, work):
    _, model, cfg = work
    step_dir = write_neox_checkpoint(model, tmp_path, step=1)
    torch.save(
        {"word_embeddings.weight": torch.zeros(1), "x": _Evil()},
        step_dir / "layer_00-model_00-model_states.pt",
    )
    with pytest.raises(
        ZerotopoError, match="layer_00-model_00-model_states.pt: not readable as a weights-only"
    ):
        check_neox_checkpoint(step_dir, cfg)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/zerotopo-neox-import-ran",))


def _model_config(tmp_path: Path, extra: str):
    (tmp_path / "model.yml").write_text(MODEL + extra)
    return load_neox_config([tmp_path / "model.yml"]).model.model_config(
        build_tokenizer("ByteTokenizer", None, None).vocab_size
    )


def _rmsnorm_checkpoint(tmp_path: Path, bias: bool) -> tuple[GPTNeoX, Path]:
    """A NeoX checkpoint of an RMSNorm model whose norms' parameters are away from their initial values."""
    cfg = _model_config(tmp_path, f"norm: rmsnorm\nuse_bias_in_norms: {str(bias).lower()}\n")
    torch.manual_seed(3)
    model = GPTNeoX(cfg)
    with torch.no_grad():  # a norm left at its initial values by the load would then show
        for name, t in model.named_parameters():
            if "norm" in name:
                t.uniform_(0.5, 1.5)
    return model, write_neox_checkpoint(model, tmp_path / "neox", step=4)


@pytest.mark.parametrize("bias", [False, True], ids=["scale", "scale-and-offset"])
def test_an_rmsnorm_checkpoint_loads_its_scale_as_the_norm_weight(tmp_path, bias):
    model, step_dir = _rmsnorm_checkpoint(tmp_path, bias)
    layer = torch.load(step_dir / "layer_02-model_00-model_states.pt", weights_only=True)
    final = torch.load(step_dir / "layer_05-model_00-model_states.pt", weights_only=True)
    assert "input_layernorm.scale" in layer and "input_layernorm.weight" not in layer  # GPT-NeoX's names
    assert ("input_layernorm.offset" in layer) == bias and "norm.scale" in final
    weights = check_neox_checkpoint(neox_step_dir(tmp_path / "neox"), model.config)
    assert set(weights) == set(model.state_dict())
    for name, t in model.state_dict().items():
        assert torch.equal(weights[name], t), name


def test_an_rmsnorm_checkpoint_into_a_layernorm_model_is_refused_naming_the_fix(tmp_path, work):
    _, _, layernorm_cfg = work
    _, step_dir = _rmsnorm_checkpoint(tmp_path, bias=True)
    with pytest.raises(
        ZerotopoError,
        match=r"input_layernorm.scale \(pipeline layer 02\), a parameter of "
        r"GPT-NeoX's RMSNorm, but the config's model has norm: layernorm; set norm: rmsnorm",
    ):
        check_neox_checkpoint(step_dir, layernorm_cfg)


def test_norm_biases_an_rmsnorm_checkpoint_lacks_name_use_bias_in_norms(tmp_path):
    _, step_dir = _rmsnorm_checkpoint(tmp_path, bias=False)
    with_bias = _model_config(tmp_path, "norm: rmsnorm\n")  # NeoX's default use_bias_in_norms: true
    with pytest.raises(ZerotopoError, match="input_layernorm.bias.*set use_bias_in_norms: false"):
        check_neox_checkpoint(step_dir, with_bias)


@pytest.mark.slow
def test_neox_weights_train_export_finetune_and_resume_with_another_batch(work):
    work, model, _ = work
    # 1) NeoX checkpoint in load:, a learning rate too small to move the weights: the saved weights are
    #    NeoX's, exported to one safetensors file.
    first = _train(
        work, "load=neox", "save=ckpt", "train_iters=1", "optimizer.params.lr=1e-12", "min_lr=0", run="r1"
    )
    assert "weights from the GPT-NeoX checkpoint" in first.stdout + first.stderr
    _run(["export", "ckpt", "w.safetensors", "--format", "safetensors"], work)
    from safetensors.torch import load_file

    exported = load_file(work / "w.safetensors")
    for name, t in model.state_dict().items():
        assert torch.allclose(exported[name], t, atol=1e-6), name
    # 2) The DCP export reads back with torch's own tool.
    _run(["export", "ckpt", "dcp_out", "--format", "dcp", "--optimizer"], work)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(work / "dcp_out", work / "full.pt")
    full = torch.load(work / "full.pt", weights_only=True)
    assert torch.equal(full["embed_in.weight"], exported["embed_in.weight"])
    assert "exp_avg/layers.0.mlp.dense_h_to_4h.weight" in full
    # 3) Resume under another global batch: continues from the consumed samples.
    resumed = _train(
        work, "load=ckpt", "save=ckpt", "train_iters=3", "train_micro_batch_size_per_gpu=3", run="r1"
    )
    assert "consumed 4 samples, not 1 x 6" in resumed.stdout + resumed.stderr
    rows = [r for r in read_metrics(work / "r1" / "metrics.csv") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["peak_memory_bytes"] > 0 for r in rows)
    # 4) finetune: true on a zerotopo checkpoint: weights only, the step counter starts again.
    tuned = _train(work, "load=ckpt", "finetune=true", "train_iters=1", run="r2")
    assert "finetune: weights of step 3" in tuned.stdout + tuned.stderr
    assert [r["step"] for r in read_metrics(work / "r2" / "metrics.csv") if r["kind"] == "train"] == [1]
    line = next(x for x in resumed.stdout.splitlines() if x.startswith("step     3/3"))
    assert "skipped 0" in line and "elapsed" in line and "ETA" in line
    assert json.loads(json.dumps(line))  # one plain line per log interval
