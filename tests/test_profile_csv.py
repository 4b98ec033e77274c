"""One CSV writer (``profile.profile_to_csv``): every preset survives the CSV round trip, and the
cost model's ``--out x.csv`` keeps ``device.gpus`` (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octopipe_core import costmodel
from octopipe_core.costmodel import PRESETS, derive_profile
from octopipe_core.profile import Profile, load_profile, parse_profile_csv, profile_to_csv
from octopipe_core.schedules import build_plan
from octopipe_core.simulator import simulate


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_csv(name: str) -> None:
    prof = Profile.from_dict(derive_profile(PRESETS[name]), name)
    back = parse_profile_csv(profile_to_csv(prof), f"{name}.csv")
    assert back.device == prof.device  # name, memory, link, gpus
    assert back == prof  # and every layer cost, the layer order and the source note


def test_costmodel_has_no_second_csv_writer() -> None:
    assert not hasattr(costmodel, "to_csv")


def test_costmodel_csv_out_keeps_gpus(tmp_path: Path) -> None:
    """``python -m octopipe_core.costmodel --preset nemotron-h-56b --out x.csv`` (TP = 8)."""
    csv_path, json_path = tmp_path / "x.csv", tmp_path / "x.json"
    assert costmodel.main(["--preset", "nemotron-h-56b", "--out", str(csv_path)]) == 0
    assert costmodel.main(["--preset", "nemotron-h-56b", "--out", str(json_path)]) == 0
    from_csv, from_json = load_profile(csv_path), load_profile(json_path)
    assert json.loads(json_path.read_text())["device"]["gpus"] == 8
    assert from_csv.device.gpus == 8 and from_csv == from_json
    plan = build_plan(from_json, "1f1b", 4, 8)
    tokens = [simulate(p, plan).tokens_per_gpu_per_s for p in (from_csv, from_json)]
    assert tokens[0] == pytest.approx(tokens[1])  # was 8x too high from the CSV


def test_a_bom_a_huge_cell_and_a_duplicate_key_are_one_line_errors() -> None:
    import json

    from octopipe_core.errors import OctoPipeError
    from octopipe_core.profile import (
        Profile,
        example_profile_dict,
        parse_profile_bytes,
        profile_to_csv,
    )

    text = profile_to_csv(Profile.from_dict(example_profile_dict()))
    # a spreadsheet's byte-order mark is not a column name
    assert parse_profile_bytes(("\ufeff" + text).encode(), "p.csv").num_layers == 4
    huge = text.replace("mamba2", "m" * 200_000, 1)
    with pytest.raises(OctoPipeError) as e:
        parse_profile_bytes(huge.encode(), "p.csv")
    assert "unreadable CSV" in str(e.value) and "\n" not in str(e.value)
    raw = json.dumps(example_profile_dict())[:-1] + ', "name": "other"}'
    with pytest.raises(OctoPipeError, match="field 'name': given twice in one object"):
        parse_profile_bytes(raw.encode(), "p.json")
