"""Input readers of `specwatch calibrate`: formats by content, field mapping, and bad input.

Every bad-input test goes through the CLI (`specwatch.cli.main`) because the contract is the
user's: one message naming the file and row on stderr, exit 2, never a traceback.
"""

import json

import pytest
from helpers.paths import FIXTURES

from specwatch.calibrate.inputfiles import detect_format, read_text
from specwatch.calibrate.inputs import BenchOptions, read_inputs
from specwatch.cli import main
from specwatch.common.errors import ConfigError

FIX = FIXTURES
SWEEP = FIX / "sd-validation" / "tomasruizt_qwen3-32b_1xH100_vllm-bench.csv"
BENCH = FIX / "vllm-bench"


def _bench_doc(**overrides):
    """A minimal but real-shaped `vllm bench serve --save-result` result (serve.py names)."""
    doc = {
        "date": "20260123-101500",
        "backend": "openai-chat",
        "model_id": "Qwen/Qwen3-32B",
        "num_prompts": 4,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 2,
        "duration": 10.0,
        "completed": 4,
        "failed": 0,
        "total_input_tokens": 400,
        "total_output_tokens": 800,
        "request_throughput": 0.4,
        "latencies": [4.0, 5.0, 6.0, 5.0],
        "mean_ttft_ms": 60.0,
    }
    doc.update(overrides)
    return doc


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _cli_error(capsys, *argv):
    code = main(["calibrate", *map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


# ------------------------------------------------------------------------------------ formats


def test_formats_are_detected_by_content_not_extension(tmp_path):
    """A CSV named .json and a JSON named .txt are still read as what they contain."""
    csv_as_json = _write(tmp_path, "a.json", "arrival_rate,latency_s,draft_length\n1,2,0\n")
    json_as_txt = _write(tmp_path, "b.txt", _bench_doc())
    assert detect_format(csv_as_json, read_text(csv_as_json)) == "csv"
    assert detect_format(json_as_txt, read_text(json_as_txt)) == "bench-json"
    assert detect_format(SWEEP, read_text(SWEEP)) == "sweep-csv"


def test_sweep_layout_maps_columns_and_shares_no_sd_runs_per_drafter():
    """The public sweep: 323 runs = 17 no-SD + 306 SD; each no-SD run joins all three drafter
    systems (a per-drafter fit is no-SD runs + that drafter's runs); λ = n/dur, not the
    two-decimal req_tp; TTFT in seconds; per-position acceptance as fractions."""
    points = read_inputs([SWEEP])
    systems = sorted({p.system for p in points})
    assert systems == [
        "Qwen3-32B+Qwen3-1.7B",
        "Qwen3-32B+Qwen3-32B-speculator.eagle3",
        "Qwen3-32B+Qwen3-4B",
    ]
    assert len(points) == 306 + 3 * 17
    first = next(p for p in points if p.source.endswith("row 2"))  # 1.7B, k=1, conc 1
    assert first.arrival_rate == pytest.approx(50 / 229.08)
    assert first.latency_s == pytest.approx(4.5656)
    assert (first.draft_length, first.acceptance_length) == (1, 1.72)
    assert (first.prompt_tokens, first.generation_tokens, first.concurrency) == (144.5, 200.0, 1)
    assert first.ttft_s == pytest.approx(0.05423)
    assert first.per_position == pytest.approx((0.7219,))
    no_sd = [p for p in points if not p.sd]
    assert len(no_sd) == 3 * 17 and all(p.acceptance_length == 1.0 for p in no_sd)


def test_bench_json_lines_with_and_without_e2el(tmp_path):
    """`--append-result` JSON lines: the SD file carries mean_e2el_ms and spec_decode_* (k from
    the per-position list, E from spec_decode_acceptance_length); the no-SD file has only
    per-request `latencies` (default --percentile-metrics), whose mean is the latency."""
    sd = read_inputs([BENCH / "qwen3-32b-eagle3-k3.jsonl"])
    assert len(sd) == 7
    c1 = sd[0]
    assert c1.source.endswith("qwen3-32b-eagle3-k3.jsonl line 1")
    assert (c1.draft_length, c1.acceptance_length) == (3, 2.18)
    assert c1.latency_s == pytest.approx(3.4865)  # mean_e2el_ms / 1000
    assert c1.arrival_rate == pytest.approx(50 / 175.11)
    assert (c1.prompt_tokens, c1.generation_tokens) == (7227 / 50, 10000 / 50)
    assert c1.concurrency == 1 and c1.ttft_s == pytest.approx(0.06769)
    assert len(c1.per_position) == 3
    nosd = read_inputs([BENCH / "qwen3-32b-nosd.jsonl"])
    assert nosd[0].draft_length == 0 and nosd[0].acceptance_length == 1.0
    first_line = (BENCH / "qwen3-32b-nosd.jsonl").read_text().split("\n")[0]
    assert "mean_e2el_ms" not in json.loads(first_line)
    assert nosd[0].latency_s == pytest.approx(6.811, rel=1e-6)
    assert nosd[0].notes  # "treated as a run without SD": the file alone cannot say


def test_a_run_with_fewer_than_two_requests_per_slot_is_transient(tmp_path):
    """A run that sends about as many requests as it has concurrency slots never reaches a
    steady state (n = c is one burst): the sweep's mt-bench runs have 80 prompts, so those at
    c = 64 and 80 are transient, the ones at c = 32 (2.5 per slot) and every InstructCoder run
    (10 per slot) are not. A bench result counts its completed requests against
    max_concurrency, or against the requests in flight without one (open loop); a row that
    does not state its request count is never called transient."""
    points = read_inputs([SWEEP])
    transient = {(p.dataset, p.concurrency) for p in points if p.transient}
    assert transient == {("mt-bench", 64.0), ("mt-bench", 80.0)}
    assert sum(p.transient for p in points) == 3 * 14
    burst = read_inputs([_write(tmp_path, "burst.json", _bench_doc(max_concurrency=4))])[0]
    steady = read_inputs([_write(tmp_path, "steady.json", _bench_doc())])[0]
    assert (burst.requests, burst.transient, steady.transient) == (4, True, False)
    open_loop = read_inputs([_write(tmp_path, "open.json", _bench_doc(max_concurrency=None))])[0]
    assert open_loop.in_flight == pytest.approx(2.0) and not open_loop.transient
    plain = _write(tmp_path, "plain.csv", "arrival_rate,latency_s,draft_length\n1,2,0\n")
    assert read_inputs([plain])[0].requests is None and not read_inputs([plain])[0].transient


def test_bench_failed_requests_are_left_out_of_the_mean(tmp_path):
    """With --save-detailed the `errors` list marks failures; without it a failed request has
    latency 0 in `latencies` (vLLM drops `errors`). Either way only successes count."""
    detailed = _write(
        tmp_path,
        "d.json",
        _bench_doc(
            failed=1, completed=3, latencies=[4.0, 0.5, 6.0, 5.0], errors=["", "timeout", "", ""]
        ),
    )
    plain = _write(
        tmp_path, "p.json", _bench_doc(failed=1, completed=3, latencies=[4.0, 0.0, 6.0, 5.0])
    )
    assert read_inputs([detailed])[0].latency_s == pytest.approx(5.0)
    assert read_inputs([plain])[0].latency_s == pytest.approx(5.0)


def test_bench_per_file_options_and_metadata(tmp_path):
    """--draft-length K FILE for files without SD counters, --no-sd FILE, and the
    `--metadata draft_length=K system=NAME dataset=NAME` keys vLLM stores at the top level."""
    a = _write(tmp_path, "a.json", _bench_doc())
    b = _write(tmp_path, "b.json", _bench_doc(draft_length="0", system="h100-eagle", dataset="x"))
    pts = read_inputs([a, b], bench_options={str(a): BenchOptions(no_sd=True)})
    assert pts[0].draft_length == 0 and not pts[0].notes
    assert (pts[1].system, pts[1].dataset, pts[1].draft_length) == ("h100-eagle", "x", 0)
    sd = _write(tmp_path, "sd.json", _bench_doc())
    with_k = read_inputs([sd], bench_options={str(sd): BenchOptions(draft_length=3)})[0]
    assert with_k.draft_length == 3 and with_k.acceptance_length is None


def test_plain_csv_optional_columns_and_shared_baseline(tmp_path):
    """Optional columns are read when present; a no-SD row with an empty `system` joins every
    named SD system of the file."""
    path = _write(
        tmp_path,
        "runs.csv",
        "system,arrival_rate,latency_s,draft_length,acceptance_length,generation_tokens\n"
        ",1.0,7.0,0,,200\n"
        "eagle,1.0,3.5,3,2.2,200\n"
        "draft-4b,1.0,4.0,3,2.5,200\n",
    )
    pts = read_inputs([path])
    assert sorted(p.system for p in pts) == ["draft-4b", "draft-4b", "eagle", "eagle"]
    assert all(p.generation_tokens == 200 for p in pts)


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("arrival_rate,latency_s,draft_length\n1,2,0\n1,-3,0\n", "row 3: latency must be > 0"),
        (
            "arrival_rate,latency_s,draft_length,acceptance_length\n1,2,3,4.5\n",
            "row 2: acceptance length 4.5 is above draft length + 1 = 4",
        ),
        ("arrival_rate,latency_s,draft_length\n1,abc,0\n", "row 2: latency_s must be a number"),
        ("arrival_rate,latency_s,draft_length\n1,nan,0\n", "row 2: latency_s must be finite"),
        ("arrival_rate,latency_s,draft_length\n", "no data rows"),
        ("arrival_rate,latency\n1,2\n", "neither a vllm bench serve result"),
        ("", "empty file"),
        ("hello world\n\x01\x02", "neither a vllm bench serve result"),
        ('{"request_throughput": 1', "invalid JSON"),
        ('{"foo": 1}', "not a vllm bench serve result: missing request_throughput"),
        ("arrival_rate,latency_s,draft_length\n1,2,-1\n", "row 2: draft length must be >= 0"),
    ],
)
def test_bad_inputs_name_file_and_row_and_exit_2(tmp_path, capsys, content, expected):
    """Garbage, empty and inconsistent files end with one message naming the file (and row)."""
    path = _write(tmp_path, "bad.csv", content)
    err = _cli_error(capsys, path)
    assert str(path) in err and expected in err


def test_binary_and_missing_files_exit_2(tmp_path, capsys):
    """Binary data and a missing path are input errors too, not tracebacks."""
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert "binary data" in _cli_error(capsys, blob)
    assert "no such file" in _cli_error(capsys, tmp_path / "nope.csv")


def test_bench_json_row_errors_name_the_line(tmp_path, capsys):
    """In `--append-result` files the message names the JSON line that is wrong."""
    good = json.dumps(_bench_doc())
    bad = json.dumps(
        _bench_doc(
            spec_decode_acceptance_length=5.0, spec_decode_per_position_acceptance_rates=[0.5, 0.3]
        )
    )
    path = _write(tmp_path, "runs.jsonl", f"{good}\n{bad}\n")
    err = _cli_error(capsys, path)
    assert f"{path} line 2" in err and "above draft length + 1 = 3" in err


def test_contradicting_sd_options_are_refused(tmp_path):
    """--no-sd on a file whose spec_decode counters say SD was on is a mistake to report."""
    path = _write(
        tmp_path,
        "sd.json",
        _bench_doc(
            spec_decode_acceptance_length=2.0, spec_decode_per_position_acceptance_rates=[0.6, 0.4]
        ),
    )
    with pytest.raises(ConfigError, match="--no-sd given, but the file has spec_decode"):
        read_inputs([path], bench_options={str(path): BenchOptions(no_sd=True)})
    with pytest.raises(ConfigError, match="draft length 3 given, but the file's SD counters say 2"):
        read_inputs([path], bench_options={str(path): BenchOptions(draft_length=3)})
