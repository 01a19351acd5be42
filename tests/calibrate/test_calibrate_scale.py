"""`calibrate` scales: many runs fit from the normal equations (the same fit as the per-pair
NNLS on the runs), and inputs past what it fits in its time and memory bounds are refused in
one line that says how to reduce them.

Timings are bench/bench_calibrate.py's; the slow test checks the memory bound on 10^5 runs.
"""

from __future__ import annotations

import csv
import random
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specwatch.calibrate import inputs, kneegrid
from specwatch.calibrate import saturation as sat
from specwatch.cli import main

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "tests/fixtures/sd-validation/tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"


def drafter_points(system_part: str) -> list[inputs.Point]:
    points = inputs.read_inputs([SWEEP])
    return [p for p in points if system_part in p.system]


@pytest.mark.parametrize("drafter", ["eagle3", "Qwen3-1.7B", "Qwen3-4B"])
def test_normal_equations_give_the_per_pair_fit(monkeypatch, drafter):
    """On the public sweep, each drafter's saturation fit from the normal equations (forced
    below its size threshold) picks the same knees and capacities and the same coefficients
    (to 1e-7) and RMS (to 1e-9) as the NNLS on the runs themselves."""
    points = drafter_points(drafter)
    direct = sat.fit_saturation(points)
    monkeypatch.setattr(kneegrid, "GRAM_MIN_POINTS", 1)
    gram = sat.fit_saturation(points)
    a, b = direct.coefficients, gram.coefficients
    for name in ("knee_v", "knee_d", "kv_cache_tokens", "kv_cache_tokens_sd"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("a_p", "b_p", "a_v", "b_v", "a_d", "b_d", "c_v", "c_d"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-7, abs=1e-12), name
    assert gram.rms == pytest.approx(direct.rms, rel=1e-9)
    assert gram.profile.keys() == direct.profile.keys()
    assert np.allclose([gram.profile[k] for k in direct.profile],
                       list(direct.profile.values()), rtol=1e-9)


def test_more_runs_than_calibrate_fits_are_refused_before_reading(monkeypatch, tmp_path,
                                                                   capsys):
    monkeypatch.setattr(inputs, "MAX_RUNS", 100)
    rows = SWEEP.read_text().splitlines()
    runs = tmp_path / "runs.csv"
    runs.write_text("\n".join(rows[:102]) + "\n")  # header + 101 runs
    rc = main(["calibrate", str(runs), "--out", str(tmp_path / "p-{system}.yaml")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{runs}: the inputs hold more than 100 runs" in err
    assert "average the repeated runs of each configuration" in err
    runs.write_text("\n".join(rows[:101]) + "\n")  # exactly 100: read (and fitted or not)
    main(["calibrate", str(runs), "--out", str(tmp_path / "p-{system}.yaml")])
    assert "runs, more than calibrate fits" not in capsys.readouterr().err


@pytest.mark.slow
def test_the_most_runs_calibrate_takes_fit_within_500_mib(tmp_path):
    """10^5 runs (the public sweep resampled with 1% latency noise, three drafters) fit, and
    the process stays under 500 MiB resident."""
    with SWEEP.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rng = random.Random(0)
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for i in range(inputs.MAX_RUNS):
            row = dict(rows[i % len(rows)])
            if i >= len(rows):
                factor = 1.0 + rng.gauss(0.0, 0.01)
                row["e2e_latency_s_est"] = f"{float(row['e2e_latency_s_est']) * factor:.4f}"
            writer.writerow(row)
    proc = subprocess.run([sys.executable, "-m", "specwatch", "calibrate", str(path), "--out",
                           str(tmp_path / "p-{system}.yaml")], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak_mib < 500, peak_mib
    assert len(list(tmp_path.glob("p-*.yaml"))) == 3
