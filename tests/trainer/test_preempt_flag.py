"""The preemption flag's agreement runs one step behind, so no step waits for the ranks to meet: a signal
recorded during step k is read at the end of step k + 1, the same on every rank (one rank here)."""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from zerotopo.trainer.peak import PeakMemory
from zerotopo.trainer.preempt import Preemption
from zerotopo_lab.bench.measure import PeakMemory as BenchPeakMemory


def test_a_signal_is_agreed_at_the_end_of_the_step_after_it(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        flag = Preemption(())
        assert flag.agreed() == 0  # step 1: nothing started before it
        flag._record(signal.SIGUSR1, None)  # the signal arrives during step 2
        assert flag.agreed() == 0  # end of step 2: step 1's flag
        assert flag.agreed() == signal.SIGUSR1  # end of step 3: step 2's flag
        assert flag.settle() == signal.SIGUSR1  # the flag started at the end of step 3
        assert flag.settle() == 0  # nothing left in flight
    finally:
        dist.destroy_process_group()


def test_the_benchmark_and_the_trainer_measure_peak_memory_with_one_probe():
    assert BenchPeakMemory is PeakMemory
    probe = PeakMemory()  # the benchmark's call: the CPU, after collecting garbage
    x = torch.ones(32 * 2**20 // 4)  # 32 MiB, touched
    peak = probe.peak_bytes()
    del x
    assert peak is not None and 30 * 2**20 <= peak <= 60 * 2**20, peak
