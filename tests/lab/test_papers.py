"""The cost model against Xu et al.'s published figures, fixed expectations with stated tolerances.

Nothing in the model was fitted to these figures: the Frontier bandwidth curves are the PCCL
reproducer's published RCCL measurements (topologies/bandwidth/frontier.yaml), the overlap parameters
are the documented defaults (zerotopo.cost.time.OverlapModel), DeepSpeed's schedule uses its default
bucket sizes (zerotopo_lab.presets). Where the model misses a figure the test asserts what the model
gives and by how much it misses, so a change that moves the prediction shows up here
(docs/cost-model.md, "Measured error", explains the gaps).
"""

from __future__ import annotations

import json

import pytest

from zerotopo.cli.main import main
from zerotopo.cost.memory import max_model_params
from zerotopo.placement.plan import get_preset
from zerotopo.placement.topology import load_topology
from zerotopo_lab.presets import COST_PRESETS

# Xu et al. §VI / Fig. 7, GPT-NeoX-20B on 384 GCDs (48 nodes), TFLOPS per GCD
PAPER_ZEROPP_OVER_ZERO3 = 1.405  # "a 40.5% increase in TFLOPS per GPU over naive ZeRO-3"
PAPER_TOPO_OVER_ZERO3 = 2.398  # "up to 139.8% ... increases in TFLOPS per GPU over ZeRO-3"
PAPER_SCALING_EFFICIENCY = 0.94  # "a scaling efficiency of 0.94 for up to 384 GCDs"


def _plan_json(capsys, nodes: int) -> dict[str, dict]:
    argv = [
        "plan", "--topology", "frontier", "--nodes", str(nodes), "--model", "configs/neox-20b.yml",
        "--micro-batch", "4", "--grad-accum", "1", "--plans", "deepspeed-zero3,deepspeed-zeropp,zerotopo",
        "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


def test_max_model_size_on_two_nodes_with_fp16_gradients():
    # Xu et al. §I: on 2 nodes (16 GCDs of 64 GB), mixed precision and Adam, "the max model size ZeRO++
    # can support is around 55B, while ZeRO-3 can support around 68B" (model states only)
    t = load_topology("frontier", nodes=2)
    z3 = max_model_params(t, get_preset("zero3"), grad_bytes=2)
    zpp = max_model_params(t, get_preset("zeropp"), grad_bytes=2)
    assert z3 / 1e9 == pytest.approx(68, rel=0.05) and zpp / 1e9 == pytest.approx(55, rel=0.05)
    # the DeepSpeed presets carry grad_dtype: param, and the cost model follows it without the argument
    assert max_model_params(t, COST_PRESETS["deepspeed-zero3"][0]) == pytest.approx(z3)
    assert max_model_params(t, COST_PRESETS["deepspeed-zeropp"][0]) == pytest.approx(zpp)
    # the engine's fp32 gradients (grad_dtype: fp32) cost 2 more bytes per parameter: 18/16 of ZeRO-3's
    assert max_model_params(t, get_preset("zero3")) == pytest.approx(z3 * 16 / 18)


def test_neox_20b_on_48_frontier_nodes_against_papers_003(capsys):
    at48 = _plan_json(capsys, 48)
    at2 = _plan_json(capsys, 2)
    tf = {k: v["tflops_per_device"] for k, v in at48.items()}
    assert all(v["fits"] for v in at48.values())
    zpp = tf["deepspeed-zeropp"] / tf["deepspeed-zero3"]
    topo = tf["zerotopo"] / tf["deepspeed-zero3"]
    eff = tf["zerotopo"] / at2["zerotopo"]["tflops_per_device"]
    # the paper's ranking holds: zerotopo > ZeRO++ > ZeRO-3
    assert topo > zpp > 1
    # ZeRO++ over ZeRO-3 at micro-batch 4, efficiency 0.5: the model gives 1.131, 20% below the paper's
    # 1.405, since DeepSpeed's two-fetch window and the separate scales all-gather are priced (1.227
    # before them); the paper's figure is inside the model's band over the inputs it does not publish
    # (test_paper_bands: 1.411 at micro-batch 1, efficiency 0.5)
    assert zpp == pytest.approx(PAPER_ZEROPP_OVER_ZERO3, rel=0.25)
    assert zpp == pytest.approx(1.131, abs=0.02)
    # zerotopo's 2 -> 48 node scaling efficiency: within 0.05 of the paper's 0.94 (the model gives 0.985:
    # the engine starts each unit's cross-node reduction in the last backward and leaves its post-step
    # parameter all-gather in flight into the next forward, so little of zerotopo's network traffic is
    # exposed at 48 nodes)
    assert eff == pytest.approx(PAPER_SCALING_EFFICIENCY, abs=0.05)
    assert eff == pytest.approx(0.986, abs=0.01)
    # zerotopo over ZeRO-3: the model MISSES the paper's 2.398 by about 41% (it gives 1.41, with the fp16
    # gradients this fp16 config gives every plan): it predicts DeepSpeed ZeRO-3 at 22.1 s per step where
    # 2.398x zerotopo's 15.6 s would be 37.5 s. Asserted as the model's figure, and as a miss, so a fix
    # shows up here.
    assert topo == pytest.approx(1.41, abs=0.04)
    assert abs(topo / PAPER_TOPO_OVER_ZERO3 - 1) > 0.15


def test_secondary_partition_that_saves_nothing_is_flagged(capsys):
    # primary weights on 2 GCDs, int8 secondary over the node (8): the backward gathers 7/8 of each unit
    # over node links where a re-gather from the primary sends 1/2 of it over the package's
    assert main(["plan", "--topology", "frontier", "--nodes", "48", "--model", "configs/neox-20b.yml",
                 "--plans", "zerotopo,deepspeed-zero3"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("zerotopo: its 8-rank int8 secondary"))
    assert "saves nothing" in line and "over node where re-gathering from the 2-rank primary" in line
    assert "p=2 g=8 o=384 qw8 qg4 takes" in line
    rec = next(x for x in out.splitlines() if x.startswith("recommended: "))
    assert "zerotopo-nosec" in rec  # the planner recommends the plan without it


def test_llama_7b_on_1024_a800_against_papers_004():
    # Lins (Chen et al.) §VI-B: LLaMA-7B, sequence 4096, micro-batch 1, global batch 4M tokens (M = 128 on 8
    # GPUs, 1 on 1024), bf16, no recomputation. MFU on 1024 GPUs: Lins 51%, DeepSpeed ZeRO-1 36%,
    # DeepSpeed MiCS 35%; on 8 GPUs ZeRO-1 reaches 63% (§II-A) and MiCS 50% (§III), so the compute
    # efficiency is set from the ZeRO-1 point (0.65), not from 1024. The baselines are priced on
    # DeepSpeed's own schedules (cost presets deepspeed-zero1, deepspeed-mics: zerotopo_lab.presets);
    # Lins on the engine's (its all-reduce in the backward, its parameter broadcast after the step: the
    # paper turned off that broadcast's overlap with the forward for the comparison).
    from zerotopo.cost.planner import CostOptions
    from zerotopo.placement.plan import Plan
    from zerotopo.placement.shape import ModelShape
    from zerotopo_lab.presets import plan_candidates

    shape = ModelShape(
        num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=4096, vocab_size=32000
    )
    plans = [
        Plan("lins", params=1, grads=1, optim="node", grad_reduce="allreduce", grad_dtype="param"),
        "deepspeed-zero1",
        "deepspeed-mics",
    ]

    def mfu(nodes, M):
        o = CostOptions(micro_batch=1, grad_accum=M, efficiency=0.65, checkpoint_activations=False)
        return {
            e.name: e.time.mfu
            for e in plan_candidates(shape, load_topology("a800", nodes=nodes), plans=plans, options=o)
        }

    at8 = mfu(1, 128)
    assert at8["deepspeed-zero1"] == pytest.approx(0.63, abs=0.03)
    at1024 = mfu(128, 1)
    # Only Lins is within 20% of the paper (53% vs 51%). DeepSpeed ZeRO-1 48% (paper 36%) and MiCS 59%
    # (paper 35%) are too fast and the model ranks MiCS first. The MiCS miss is not one of the network:
    # on one node (8 GPUs, no network traffic) the model already gives DeepSpeed MiCS 62% where the
    # paper measured 50%, so what slows DeepSpeed's stage-3 machinery there (per-module fetches and
    # hooks) is outside the model. ZeRO-1 loses 26% of its MFU from 8 to 1,024 GPUs in the model and
    # 43% in the paper: its step-end all-gather over 1,024 ranks is priced at the A800 data sheet's
    # alpha-beta rate (no measured NCCL curves of this cluster). Asserted as the model's figures and as
    # misses.
    assert at8["deepspeed-mics"] == pytest.approx(0.624, abs=0.01)
    assert at1024["lins"] == pytest.approx(0.51, rel=0.2)
    assert at1024 == pytest.approx(
        {"lins": 0.533, "deepspeed-zero1": 0.482, "deepspeed-mics": 0.586}, abs=0.02
    )
    assert at1024["deepspeed-mics"] > at1024["lins"] > at1024["deepspeed-zero1"]
    assert at1024["deepspeed-zero1"] > 0.36 * 1.2 and at1024["deepspeed-mics"] > 0.35 * 1.2
