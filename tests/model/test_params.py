"""The parameters file: strict loading that names file, line and field; exact round trips."""

import shutil
from pathlib import Path

import pytest

from specwatch.common.errors import ConfigError
from specwatch.model.coefficients import Coefficients, MoECoefficients
from specwatch.model.params import Params, dump_params, load_params, params_from_mapping

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "params").glob("*.yaml"))

GOOD = """\
system: test-system
coefficients:
  a_p: 0.1
  b_p: 0.01
  a_v: 0.02
  b_v: 0.001
  a_d: 0.002
  b_d: 0.0005
"""


def write(tmp_path, text, name="params.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_example_files_load_with_provenance(path):
    """Every example parameters file (calibration writes them) passes strict loading and
    says how it was fitted."""
    params = load_params(path)
    assert isinstance(params.model(), Coefficients)
    assert params.provenance.get("method") and params.provenance.get("data")
    assert params.provenance.get("r2") is not None


def test_minimal_file_gets_defaults(tmp_path):
    params = load_params(write(tmp_path, GOOD))
    assert params.coefficients == Coefficients(0.1, 0.01, 0.02, 0.001, 0.002, 0.0005)
    assert params.max_utilization == 0.9 and params.k_max == 8
    assert params.moe is None and params.acceptance_profile is None


def test_negative_coefficient_names_file_line_and_field(tmp_path):
    """The error a user sees says where and what: file:line: coefficients.a_v: ... got -1."""
    path = write(tmp_path, GOOD.replace("a_v: 0.02", "a_v: -1"))
    with pytest.raises(ConfigError) as err:
        load_params(path)
    assert str(err.value) == (
        f"{path}:5: coefficients.a_v: expected a non-negative number of seconds, got -1"
    )


def test_unit_strings_are_converted_to_seconds(tmp_path):
    """'20ms' and '500us' are read as 0.02 s and 0.0005 s."""
    text = GOOD.replace("a_v: 0.02", "a_v: 20ms").replace("b_d: 0.0005", "b_d: 500us")
    params = load_params(write(tmp_path, text))
    assert params.coefficients.a_v == pytest.approx(0.02)
    assert params.coefficients.b_d == pytest.approx(0.0005)


def test_milliseconds_written_as_seconds_are_caught(tmp_path):
    """A 340-second decode step is a unit mistake: the message suggests milliseconds."""
    with pytest.raises(ConfigError, match=r"coefficients\.a_v: 340 s .*milliseconds"):
        load_params(write(tmp_path, GOOD.replace("a_v: 0.02", "a_v: 340")))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (GOOD.replace("a_v: 0.02", "a_v: fast"), "coefficients.a_v: expected a non-negative"),
        (GOOD.replace("a_v: 0.02", "a_v: .nan"), "coefficients.a_v: expected"),
        (GOOD.replace("a_v: 0.02", "a_v: true"), "coefficients.a_v: expected"),
        (GOOD.replace("  b_d: 0.0005\n", ""), "coefficients: missing required key 'b_d'"),
        (GOOD + "k_maks: 4\n", "k_maks: unknown key"),
        (GOOD + "k_max: 0\n", "k_max: expected an integer in [1, 64]"),
        (GOOD + "max_utilization: 1.5\n", "max_utilization: expected a utilisation ceiling"),
        (GOOD + "acceptance_profile: [0.5, 0.7]\n", "acceptance_profile[1]: 0.7 is above"),
        (GOOD + "acceptance_profile: [1.2]\n", "acceptance_profile[0]: expected a probability"),
        (GOOD + "acceptance_profile: []\n", "acceptance_profile: expected a non-empty list"),
        (GOOD + "b_v_context: -1e-6\n", "b_v_context: expected a non-negative"),
        (GOOD + "provenance: {r2: 1.5}\n", "provenance.r2: expected a coefficient"),
        (GOOD + "provenance: {mape: -0.1}\n", "provenance.mape: expected a non-negative"),
        (GOOD + "provenance: {data: [1, 2]}\n", "provenance.data: expected a list of strings"),
        (GOOD.replace("system: test-system", "system: ''"), "system: expected a non-empty"),
        (GOOD + "moe: {experts: 8, active_experts: 9, expert_coefficients: "
         "{a_p: 0, b_p: 0, a_v: 0, b_v: 0}}\n",
         "moe.active_experts: expected an integer in [1, 8]"),
        (GOOD + "moe: {experts: 8, active_experts: 2}\n", "moe: missing required key"),
        (GOOD.replace("a_p: 0.1", "a_p: 0").replace("a_v: 0.02", "a_v: 0"),
         "a_p and a_v are both 0"),
        (GOOD + "system: other\n", "system: duplicate key"),
        ("system: [unclosed\n", "not valid YAML"),
        ("", "empty parameters file"),
        ("- a\n- b\n", "expected a mapping"),
    ],
)
def test_bad_files_raise_config_error_naming_the_field(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as err:
        load_params(write(tmp_path, text))
    assert fragment in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "params.yaml"))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_moe_block_builds_moe_coefficients(tmp_path):
    text = GOOD + (
        "moe:\n  experts: 128\n  active_experts: 8\n"
        "  expert_coefficients: {a_p: 0.05, b_p: 0.002, a_v: 0.01, b_v: 0.0002}\n"
    )
    model = load_params(write(tmp_path, text)).model()
    assert isinstance(model, MoECoefficients)
    assert model.experts == 128 and model.active_experts == 8
    assert model.expert.a_v == 0.01


def test_round_trip_is_exact(tmp_path):
    """dump_params then load_params gives back an equal object (floats at full precision)."""
    original = params_from_mapping(
        {
            "system": "round-trip",
            "coefficients": {"a_p": 0.1 / 3, "b_p": 1e-7, "a_v": 0.0341700001, "b_v": 8.6e-5,
                             "a_d": 0.00105, "b_d": 5.8e-5},
            "b_v_context": 2.5e-9,
            "moe": {"experts": 64, "active_experts": 4,
                    "expert_coefficients": {"a_p": 0.01, "b_p": 0.0, "a_v": 0.003, "b_v": 1e-5}},
            "acceptance_profile": [0.8, 0.5, 0.25],
            "max_utilization": 0.85,
            "k_max": 6,
            "provenance": {"method": "nnls", "fitted_at": "2026-07-01T12:00:00Z", "r2": 0.991,
                           "mape": 0.018, "data": ["a.csv"], "identifiable": ["a_v"]},
        }
    )
    path = tmp_path / "out.yaml"
    dump_params(original, path)
    again = load_params(path)
    assert again == original
    assert isinstance(again.provenance["fitted_at"], str)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_round_trips(tmp_path, path):
    copy = tmp_path / "example.yaml"
    shutil.copy(path, copy)
    params = load_params(copy)
    dump_params(params, copy)
    assert load_params(copy) == params


def test_params_is_what_model_functions_take():
    params = Params(system="x", coefficients=Coefficients(0.1, 0, 0.02, 0, 0, 0))
    assert params.model() is params.coefficients


def test_readme_schema_example_is_a_valid_file(tmp_path):
    """The YAML block in docs/whatif.md "Parameters file" loads: the docs cannot drift from
    the code."""
    readme = (ROOT / "docs" / "whatif.md").read_text()
    section = readme[readme.index("## Parameters file"):]
    block = section[section.index("```yaml") + len("```yaml"):]
    block = block[: block.index("```")]
    params = load_params(write(tmp_path, block))
    assert params.moe is not None and params.moe.experts == 128
    assert params.provenance["r2"] == 0.991


def test_server_capacity_is_recorded_and_is_the_models_capacity(tmp_path):
    """`server_capacity` (what the servers stated) loads, round-trips, and sets the model's
    capacity terms where `capacity` does not; `capacity` keeps the last word."""
    path = write(tmp_path, GOOD + "server_capacity:\n  kv_cache_tokens: 524288\n"
                 "  kv_cache_tokens_sd: 400000\n  max_num_seqs: 256\n")
    params = load_params(path)
    assert params.server_capacity is not None
    assert params.server_capacity.to_mapping() == {
        "kv_cache_tokens": 524288.0, "kv_cache_tokens_sd": 400000.0, "max_num_seqs": 256.0}
    c = params.coefficients
    assert (c.kv_cache_tokens, c.kv_cache_tokens_sd, c.max_num_seqs) == (
        524288.0, 400000.0, 256.0)
    dump_params(params, tmp_path / "again.yaml")
    assert load_params(tmp_path / "again.yaml") == params
    both = load_params(write(tmp_path, GOOD + "capacity:\n  kv_cache_tokens_sd: 30000\n"
                             "server_capacity:\n  kv_cache_tokens_sd: 400000\n", "b.yaml"))
    assert both.coefficients.kv_cache_tokens_sd == 30000.0
    assert both.server_capacity.kv_cache_tokens_sd == 400000.0


def test_files_without_server_capacity_have_none(tmp_path):
    params = load_params(write(tmp_path, GOOD))
    assert params.server_capacity is None
    assert "server_capacity" not in params.to_mapping()
    old = load_params(ROOT / "tests" / "fixtures" / "params" / "qwen3-32b-h100-eagle3-linear.yaml")
    assert old.server_capacity is None and not old.coefficients.saturates


@pytest.mark.parametrize(("text", "fragment"), [
    ("server_capacity:\n  kv_cache_tokens: 0\n", "server_capacity.kv_cache_tokens: expected"),
    ("server_capacity:\n  max_num_seqs: -1\n", "server_capacity.max_num_seqs: expected"),
    ("server_capacity:\n  kv_tokens: 5\n", "server_capacity.kv_tokens: unknown key"),
    ("server_capacity: 5\n", "server_capacity: expected a mapping"),
])
def test_bad_server_capacity_names_the_field(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as exc:
        load_params(write(tmp_path, GOOD + text))
    assert fragment in str(exc.value) and "params.yaml:" in str(exc.value)
