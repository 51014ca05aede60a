"""One checkpoint-folder pattern: the store names step directories the way retention and discovery
find them."""

from __future__ import annotations

from zerotopo.checkpoint import retention, store
from zerotopo.checkpoint.retention import STEP_DIR, checkpoint_steps, step_dir_name


def test_store_and_retention_share_the_step_directory_pattern(tmp_path):
    assert store.STEP_DIR is retention.STEP_DIR
    for step in (0, 7, 120000):
        name = step_dir_name(step)
        assert name == f"step_{step}" and int(STEP_DIR.match(name).group(1)) == step
    for name in ("step_3", "step_12", "step_x", "global_step5", "step_4.tmp"):
        (tmp_path / name).mkdir()
    assert [s for s, _ in checkpoint_steps(tmp_path)] == [3, 12]
