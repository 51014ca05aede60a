"""``zerotopo topo`` and ``zerotopo plan`` through the CLI entry point: output, JSON keys, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerotopo.cli.main import main
from zerotopo.config.model_files import DEFAULT_VOCAB, load_model

REPO = Path(__file__).resolve().parents[2]

TINY_MODEL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "checkpoint_activations": True,
}


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def test_topo_show_list_and_validate(capsys, tmp_path):
    rc, out, _ = _run(capsys, "topo", "show", "frontier", "--nodes", "2")
    assert rc == 0
    assert "frontier: 2 node(s) x 8 devices" in out and "16 ranks" in out
    assert "package  2        2        200" in out  # tier table: fan-out, devices, GB/s per device
    assert "12.5 (100/node)" in out
    assert "package 2 (200 GB/s, 2 us): ranks 4 5  <- local ranks 0 1" in out  # srun puts local 0 on GCD 4
    assert "node 1 (50 GB/s, 4 us): ranks 8 9 10 11 12 13 14 15" in out
    rc, out, _ = _run(capsys, "topo", "show", "frontier", "--nodes", "48")
    assert rc == 0 and "nodes 2..47 repeat the layout" in out
    rc, out, _ = _run(capsys, "topo", "list")
    assert rc == 0 and {line.split(":")[0] for line in out.splitlines()} >= {
        "frontier",
        "dgx-a100",
        "dgx-h100",
        "emulated",
    }
    good = tmp_path / "mine.yaml"
    good.write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "device": {"name": "gpu", "memory_gib": 40, "peak_tflops": 300},
                "tiers": [{"name": "node", "fanout": 4, "bandwidth_gbps": 100, "latency_us": 3}],
                "network": {"name": "ib", "injection_gbps": 100, "latency_us": 5},
            }
        )
    )
    rc, out, _ = _run(capsys, "topo", "validate", str(good), "--nodes", "3")
    assert rc == 0 and out.startswith(f"OK {good}") and "12 ranks of gpu" in out


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: x\ntiers: [\n", "not valid YAML"),
        (
            "name: x\ndevice: {name: g, memory_gib: 1, peak_tflops: 1}\nnetwork: {name: n, injection_gbps: 1, latency_us: 1}\n",
            "tiers: missing required key 'tiers'",
        ),
        (
            "name: x\ndevice: {name: g, memory_gib: 1, peak_tflops: 1, hbm: 2}\ntiers: []\nnetwork: {}\n",
            "device.hbm: unknown key 'hbm'",
        ),
        (
            "name: x\ndevice: {name: g, memory_gib: 1, peak_tflops: 1}\n"
            "tiers: [{name: node, fanout: -2, bandwidth_gbps: 1, latency_us: 1}]\n"
            "network: {name: n, injection_gbps: 1, latency_us: 1}\n",
            "tiers[0].fanout: expected a value > 0, found -2",
        ),
        (
            "name: x\ndevice: {name: g, memory_gib: 1, peak_tflops: 1}\n"
            "tiers: [{name: node, fanout: 2, bandwidth_gbps: fast, latency_us: 1}]\n"
            "network: {name: n, injection_gbps: 1, latency_us: 1}\n",
            "expected a number, found 'fast'",
        ),
        (
            "name: x\ndevice: {name: g, memory_gib: 1, peak_tflops: 1}\n"
            "tiers: [{name: node, fanout: 2, bandwidth_gbps: 1, latency_us: 1}]\n"
            "network: {name: n, injection_gbps: 1, latency_us: 1}\ndevice_order: [1, 1]\n",
            "exactly once",
        ),
    ],
)
def test_topo_validate_errors_exit_2_without_traceback(capsys, tmp_path, text, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    rc, out, err = _run(capsys, "topo", "validate", str(bad))
    assert rc == 2 and out == ""
    assert err.startswith("zerotopo topo: error: ") and str(bad) in err and words in err


def _model(tmp_path, **changes):
    path = tmp_path / "tiny.yml"
    path.write_text(yaml.safe_dump({**TINY_MODEL, **changes}))
    return str(path)


def test_plan_table(capsys, tmp_path):
    model = _model(tmp_path)
    rc, out, _ = _run(capsys, "plan", "--topology", "emulated", "--model", model, "--plans", "presets")
    assert rc == 0
    lines = out.splitlines()
    assert "micro-batch 2, 4 micro-batches per step" in lines[0]
    header = lines[3].split()
    assert header[:2] == ["plan", "degrees"] and header[-3:] == ["s", "TFLOPS", "fits"]
    assert "intra" in lines[3] and "inter" in lines[3]
    end = lines.index("", 4)
    rows = {line.split()[0]: line for line in lines[4:end]}
    assert {"ddp", "zero1", "zero2", "zero3", "zeropp", "mics", "zerotopo", "zerotopo-pkg"} <= set(rows)
    assert "p=2 s=4/int8 g=4 o=8 qw8 qg4" in rows["zerotopo"]
    # the recommendation names the first fitting row (or, within 0.5% of it, the smallest), or a plan
    # without a secondary partition that one of the rows pays memory for (explained on its own line)
    first_fit = next(name for name, line in rows.items() if line.endswith("yes"))
    rec = lines[end + 1]
    assert rec.startswith("recommended: ") and "fastest plan that fits" in rec
    name = rec.split()[1].rstrip(":")
    assert (
        name == first_fit
        or ("within 0.5%" in rec and rows[name].endswith("yes"))
        or (name.endswith("-nosec") and any(x.startswith(f"{name[:-6]}: its ") for x in lines[end + 2 :]))
    )


def test_plan_json_and_flags(capsys, tmp_path):
    model = _model(tmp_path)
    rc, out, _ = _run(
        capsys,
        "plan",
        "--topology",
        "frontier",
        "--nodes",
        "2",
        "--model",
        model,
        "--plans",
        "zero3,zerotopo",
        "--json",
        "--micro-batch",
        "1",
        "--grad-accum",
        "8",
        "--efficiency",
        "0.4",
    )
    assert rc == 0
    rows = json.loads(out)
    assert sorted(r["name"] for r in rows) == ["zero3", "zerotopo"]
    for r in rows:
        assert {
            "name",
            "degrees",
            "memory_bytes",
            "comm_bytes",
            "step_time_s",
            "tflops_per_device",
            "fits",
        } <= set(r)
        assert {"params", "secondary", "grads", "optim", "total"} <= set(r["memory_bytes"])
        assert set(r["comm_bytes"]) == {"package", "node", "network"} and r["fits"] is True
    zt = next(r for r in rows if r["name"] == "zerotopo")
    assert zt["degrees"] == "p=2 s=8/int8 g=8 o=16 qw8 qg4"
    # a measured table slows the network down: the same plans take longer
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"topology": "frontier", "tiers": {"network": {"bandwidth_gbps": 0.01}}}))
    rc, out2, _ = _run(
        capsys,
        "plan",
        "--topology",
        "frontier",
        "--nodes",
        "2",
        "--model",
        model,
        "--plans",
        "zero3,zerotopo",
        "--json",
        "--micro-batch",
        "1",
        "--grad-accum",
        "8",
        "--efficiency",
        "0.4",
        "--calibration",
        str(cal),
    )
    slow = {r["name"]: r["step_time_s"] for r in json.loads(out2)}
    assert all(slow[r["name"]] > r["step_time_s"] for r in rows)


def test_plan_models_by_name_and_vocabulary(tmp_path):
    shape, args = load_model(["neox-20b"], None)
    assert (shape.num_layers, shape.hidden_size, shape.vocab_size) == (44, 6144, DEFAULT_VOCAB)
    assert args.batch.micro_batch_size == 4 and args.batch.gradient_accumulation_steps == 1
    tok = tmp_path / "tok.json"
    tok.write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"id": 300}]}))
    shape, _ = load_model([_model(tmp_path, tokenizer_type="HFTokenizer", vocab_file=str(tok))], None)
    assert shape.vocab_size == 384  # 301 tokens padded to a multiple of 128
    shape, _ = load_model([_model(tmp_path)], 1000)
    assert shape.vocab_size == 1024


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--model", "gpt-5"], "'gpt-5' is neither a config file nor a built-in config"),
        (["--model", "neox-20b", "--topology", "summit"], "unknown topology 'summit'"),
        (["--model", "neox-20b", "--plans", "zero9"], "unknown plan preset 'zero9'"),
        (["--model", "neox-20b", "--nodes", "0"], "--nodes: expected a positive number"),
        (["--model", "neox-20b", "--efficiency", "2"], "--efficiency: expected a fraction"),
        (["--model", "neox-20b", "--calibration", "/nonexistent.yaml"], "does not exist"),
        (["--model", "neox-20b", "--unit-layers", "0"], "--unit-layers: expected positive layer counts"),
        (["--model", "neox-20b", "--plans", "deepspeed-zero9"], "for the cost model deepspeed-zero3"),
    ],
)
def test_plan_errors_exit_2(capsys, argv, words):
    rc, out, err = _run(capsys, "plan", *argv)
    assert rc == 2 and words in err


def test_plan_explain(capsys, tmp_path):
    model = _model(tmp_path)
    rc, out, _ = _run(
        capsys, "plan", "--topology", "frontier", "--nodes", "2", "--model", model,
        "--plans", "zero3,zerotopo,deepspeed-zero3", "--explain", "zerotopo",
    )  # fmt: skip
    assert rc == 0
    lines = out.splitlines()
    head = lines[0]
    assert head.startswith("zerotopo (p=2 s=8/int8 g=8 o=16 qw8 qg4) on frontier x 2 nodes: step ")
    # step = compute + slowdown + exposed communication, as printed
    nums = [float(x) for x in head.replace(" s", " ").split() if x.replace(".", "", 1).isdigit()]
    step, compute, slow, exposed = nums[-4:]
    assert step == pytest.approx(compute + slow + exposed, abs=2e-3)
    table_head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["phase", "collective"])
    rows = lines[table_head + 1 : lines.index("", table_head)]
    assert {r.split()[0] for r in rows} >= {
        "forward",
        "backward",
        "grad_reduce",
        "replica_reduce",
        "param_gather",
    }
    for r in rows:  # hidden + exposed = total
        total, hidden, exp = (float(x) for x in r.split()[-3:])
        assert total == pytest.approx(hidden + exp, abs=2e-3)
    assert sum(x.startswith("vs ") for x in lines) == 2 and any(
        x.startswith("vs deepspeed-zero3 (") for x in lines
    )


def test_plan_scaling_and_plot(capsys, tmp_path):
    model = _model(tmp_path)
    png = tmp_path / "scaling.png"
    rc, out, _ = _run(
        capsys, "plan", "--topology", "frontier", "--model", model, "--plans", "zero3,zerotopo",
        "--scaling", "1,2,4", "--plot", str(png),
    )  # fmt: skip
    assert rc == 0
    lines = out.splitlines()
    assert lines[1].split() == ["nodes", "zero3", "zerotopo"]
    assert [x.split()[0] for x in lines[2:5]] == ["1", "2", "4"]
    eff = lines[5].split()
    assert eff[:2] == ["scaling", "eff."]
    first, last = float(lines[2].split()[1]), float(lines[4].split()[1])
    assert float(eff[2]) == pytest.approx(last / first, rel=0.02) and eff[3] == "(1->4)"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc, _, err = _run(capsys, "plan", "--model", model, "--plot", str(png))
    assert rc == 2 and "--plot" in err and "--scaling" in err
    rc, _, err = _run(capsys, "plan", "--model", model, "--scaling", "1,x")
    assert rc == 2 and "--scaling" in err


def test_plan_runs_without_importing_torch():
    """``zerotopo plan`` prices plans from a NeoX config without loading torch (seconds of start-up on a
    login node): the config parser's tokenizer table and the data package load lazily."""
    code = (
        "import sys\n"
        "from zerotopo.cli.main import main\n"
        "try:\n"
        "    main(['plan', '--topology', 'frontier', '--nodes', '2', '--model', 'configs/neox-20b.yml',"
        " '--plans', 'presets'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    assert out.stdout.strip().endswith("torch not loaded"), out.stdout[-2000:] + out.stderr[-2000:]
