"""``TargetSnapshot.replaced`` is ``dataclasses.replace`` without re-running ``__init__``.

Protected behaviour (a target hook copies every target's snapshot on every
poll): for any set of changed fields the copy equals what :func:`dataclasses.replace`
gives, field by field and by identity where a field is not changed; the original is
unchanged; a name that is not a field is refused like ``replace`` refuses it.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specwatch.poll.snapshot import ModelSnapshot, TargetSnapshot

FIELDS = [f.name for f in dataclasses.fields(TargetSnapshot)]

#: A value for each field that differs from the base snapshot's.
NEW = {
    "name": "other", "up": False, "timestamp": 2.5, "poll_duration_seconds": 0.25,
    "errors_total": {"timeout": 3}, "counter_resets_total": 4,
    "series_dropped_total": {"max_series": 1}, "models_dropped_total": {"max_models": 2},
    "label_values_truncated_total": 5, "last_success_timestamp": 1.5,
    "last_error": "parse: x", "engine": "sglang",
    "models": {"m": ModelSnapshot("m", "vllm", 3, ())},
    "extensions": {"k": 1}, "server": object(),
}


def _base() -> TargetSnapshot:
    return TargetSnapshot(name="t", up=True, timestamp=1.0, engine="vllm",
                          models={"a": ModelSnapshot("a", "vllm", None, ())},
                          extensions={"x": 2})


def test_every_field_has_a_changed_value_here() -> None:
    assert sorted(NEW) == sorted(FIELDS)


@given(st.sets(st.sampled_from(FIELDS)))
def test_equals_dataclasses_replace(names: set[str]) -> None:
    base = _base()
    before = {f: getattr(base, f) for f in FIELDS}
    changes = {n: NEW[n] for n in names}
    got, want = base.replaced(**changes), dataclasses.replace(base, **changes)
    assert type(got) is TargetSnapshot and got == want
    for f in FIELDS:
        assert getattr(got, f) is (changes[f] if f in changes else before[f])
        assert getattr(base, f) is before[f]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.up = True  # type: ignore[misc]


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(TypeError, match="no field 'modles'"):
        _base().replaced(modles={})
    with pytest.raises(TypeError):
        dataclasses.replace(_base(), modles={})
