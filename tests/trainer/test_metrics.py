"""Run-directory outputs: the metrics CSV round-trips and the plots are written."""

from __future__ import annotations

import pytest

from zerotopo.trainer.metrics import MetricsWriter, plot_run, read_metrics


def test_csv_round_trip_and_plots(tmp_path):
    w = MetricsWriter(tmp_path, ["package", "node", "network"], tensorboard=False)
    for step in range(1, 6):
        w.write(
            {
                "kind": "train",
                "step": step,
                "loss": 5.0 - step * 0.5,
                "lr": 1e-3,
                "bytes_package": 1000 * step,
                "bytes_node": 10,
                "bytes_network": 3,
            }
        )
    w.write({"kind": "valid", "step": 5, "loss": 2.75})
    w.close()
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 5]
    assert rows[0]["loss"] == pytest.approx(4.5) and rows[-1]["kind"] == "valid"
    assert rows[2]["bytes_package"] == 3000
    pytest.importorskip("matplotlib")
    files = plot_run(tmp_path)
    assert {f.name for f in files} == {"loss.png", "bytes_per_tier.png"}
    assert all(f.stat().st_size > 1000 for f in files)
