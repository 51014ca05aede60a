"""Device lists that hide every GPU are refused before any rank starts, and ranks that see different device
kinds stop at the rendezvous naming the rank that differs (real processes over a real TCP store)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zerotopo.errors import LaunchError
from zerotopo.launch.devices import check_device_list
from zerotopo.launch.spawn import free_port
from zerotopo.placement.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("var", ["ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"])
@pytest.mark.parametrize("value", ["", "-1", " , ", "-1,0"])
def test_a_list_hiding_every_device_is_an_error_on_a_gpu_topology(var, value):
    with pytest.raises(LaunchError, match=f"{var}=.* hides every device, but topology 'frontier'"):
        check_device_list({var: value}, load_topology("frontier"))
    check_device_list({var: value}, load_topology("emulated"))  # CPU ranks: nothing to hide
    check_device_list({var: "0,1"}, load_topology("frontier"))


@pytest.mark.parametrize(
    "var,value",
    [("CUDA_VISIBLE_DEVICES", "8"), ("HIP_VISIBLE_DEVICES", "9,10"), ("ROCR_VISIBLE_DEVICES", "12,0")],
)
def test_a_list_of_devices_the_node_does_not_have_hides_every_device(var, value):
    # frontier's node has 8 GCDs (0-7); the runtimes stop reading a list at its first invalid entry
    with pytest.raises(
        LaunchError, match=f"{var}='{value}' hides every device \\(device {value.split(',')[0]} is "
    ):
        check_device_list({var: value}, load_topology("frontier"))
    check_device_list({var: "7,8"}, load_topology("frontier"))


def test_a_launched_rank_that_sees_no_device_names_the_variable():
    with pytest.raises(
        LaunchError, match="CUDA_VISIBLE_DEVICES='3' leaves this rank no device, but topology"
    ):
        check_device_list({"CUDA_VISIBLE_DEVICES": "3"}, load_topology("frontier"), device_count=0)
    check_device_list({"CUDA_VISIBLE_DEVICES": "3"}, load_topology("frontier"), device_count=1)
    check_device_list({}, load_topology("emulated"), device_count=0)


def test_the_train_command_refuses_it_before_spawning(capfd):
    import os

    from zerotopo.cli.main import main

    os.environ["ROCR_VISIBLE_DEVICES"] = "-1"
    try:
        code = main(["train", "tiny", "--topology", "frontier", "--nodes", "1", "--no-progress"])
    finally:
        del os.environ["ROCR_VISIBLE_DEVICES"]
    err = capfd.readouterr().err
    assert code == 2 and "ROCR_VISIBLE_DEVICES='-1' hides every device" in err, err


_RANK = """
import datetime, sys
import torch.distributed as dist
from zerotopo.errors import LaunchError
from zerotopo.launch.devices import agree_on_device_kind
rank, port, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
store = dist.TCPStore("127.0.0.1", port, 3, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
try:
    agree_on_device_kind(store, rank, 3, kind, 60)
    print("agreed")
except LaunchError as exc:
    print(exc)
"""


@pytest.mark.parametrize("kinds,agree", [(["rocm", "rocm", "rocm"], True), (["rocm", "rocm", "cpu"], False)])
def test_ranks_agree_on_the_device_kind_at_rendezvous(kinds, agree):
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(r), str(port), k],
            stdout=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        for r, k in enumerate(kinds)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    if agree:
        assert outs == ["agreed"] * 3
    else:
        assert all("rank 2 found device kind 'cpu', rank 0 found 'rocm'" in o for o in outs), outs
