"""A full resume settles the optimizer once: the model and optimizer components share one settle, run
after every component has loaded, on the loaded step (AdamW, and Muon, whose settle also hands the
loaded states to the matrices' owners); the resumed optimizer then steps bit for bit as the one saved."""

from __future__ import annotations

import pytest

from tests.trainer.ckpt_workers import settle_count_worker
from zerotopo.launch.spawn import spawn

pytestmark = pytest.mark.slow

MUON = ("Muon", {"momentum": 0.9, "aux": {"type": "AdamW", "lr": 3e-3}})


@pytest.mark.parametrize("optimizer", [("AdamW", {}), MUON], ids=["adamw", "muon"])
def test_a_full_resume_settles_the_optimizer_once(tmp_path, optimizer):
    ranks = spawn(settle_count_worker, 2, args=(str(tmp_path), optimizer), ranks_per_node=2, timeout_s=900)
    for r in ranks:
        assert r["settles"] == [2]  # one settle, at the step the checkpoint was written
        assert r["same"] and r["steps"] == (3, 3)
