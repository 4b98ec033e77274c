"""Profiles: JSON and CSV forms, pattern strings, defaults and one-line errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import (
    FAMILIES,
    W_STASH_DEFAULT_RATIO,
    example_profile_dict,
    list_samples,
    load_profile,
    load_sample,
    parse_profile_bytes,
    parse_profile_csv,
    profile_to_csv,
)


def write(tmp_path: Path, data: object, name: str = "p.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_samples_load() -> None:
    names = list_samples()
    for n in ("llama-3-8b", "nemotron-h-8b", "nemotron-h-56b", "jamba-v0.1"):
        assert n in names
        prof = load_sample(n)
        assert prof.layers[0] == "embedding" and prof.layers[-1] == "lm_head"
        assert all(lt.family in FAMILIES for lt in prof.layer_types)


def test_defaults_and_family_inference(tmp_path: Path) -> None:
    prof = load_profile(write(tmp_path, example_profile_dict()))
    m = prof.type_map()["mamba2"]
    assert m.family == "mamba"
    assert m.w_stash_mib == pytest.approx(100 * W_STASH_DEFAULT_RATIO)
    assert prof.type_map()["lm_head"].family == "lm_head"


def test_pattern_string(tmp_path: Path) -> None:
    d = example_profile_dict()
    d["layer_types"]["attention"] = dict(d["layer_types"]["mamba2"])
    d["layers"] = "EMM*ML"
    d["pattern_symbols"] = {"E": "embedding", "M": "mamba2", "*": "attention", "L": "lm_head"}
    prof = load_profile(write(tmp_path, d))
    assert prof.layers == ("embedding", "mamba2", "mamba2", "attention", "mamba2", "lm_head")


def test_csv_round_trip(tmp_path: Path) -> None:
    prof = load_sample("nemotron-h-8b")
    text = profile_to_csv(prof)
    back = parse_profile_csv(text, "x.csv")
    assert back.layers == prof.layers
    assert back.type_map()["mamba2"] == prof.type_map()["mamba2"]
    assert load_sample("tiny-hybrid").num_layers >= 6


def bad(mutate, tmp_path: Path) -> str:
    d = copy.deepcopy(example_profile_dict())
    mutate(d)
    with pytest.raises(OctoPipeError) as e:
        load_profile(write(tmp_path, d, "bad.json"))
    msg = str(e.value)
    assert "\n" not in msg and "bad.json" in msg and "fix:" in msg
    return msg


def test_one_line_errors(tmp_path: Path) -> None:
    assert "format" in bad(lambda d: d.update(format="v0"), tmp_path)
    assert "layer_types.mamba2.forward_ms" in bad(
        lambda d: d["layer_types"]["mamba2"].update(forward_ms="fast"), tmp_path
    )
    assert "layer_types.mamba2.activation_mib" in bad(
        lambda d: d["layer_types"]["mamba2"].pop("activation_mib"), tmp_path
    )
    assert ">= 0" in bad(lambda d: d["layer_types"]["mamba2"].update(weight_mib=-1), tmp_path)
    msg = bad(lambda d: d["layer_types"]["mamba2"].update(family="ssm"), tmp_path)
    assert all(f in msg for f in FAMILIES)
    msg = bad(lambda d: d["layer_types"].update(foo=d["layer_types"]["mamba2"]), tmp_path)
    assert "layer_types.foo.family" in msg and "transformer_block" in msg
    assert "layers[2]" in bad(lambda d: d["layers"].__setitem__(2, "mamba3"), tmp_path)
    assert "w_stash_mib" in bad(
        lambda d: d["layer_types"]["mamba2"].update(w_stash_mib=1000), tmp_path
    )
    assert "tokens_per_microbatch" in bad(lambda d: d.update(tokens_per_microbatch=0), tmp_path)
    assert "device.p2p_gbps" in bad(lambda d: d["device"].update(p2p_gbps=0), tmp_path)
    assert "pattern_symbols" in bad(lambda d: d.update(layers="MM"), tmp_path)
    msg = bad(lambda d: d.update(layers="MX", pattern_symbols={"M": "mamba2"}), tmp_path)
    assert "layers[1]" in msg and "'X'" in msg
    assert "colour" in bad(lambda d: d.update(colour="red"), tmp_path)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(OctoPipeError, match="invalid JSON"):
        load_profile(write(tmp_path, "{not json", "x.json"))
    with pytest.raises(OctoPipeError, match="file not found"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(OctoPipeError, match="UTF-8"):
        parse_profile_bytes(b"\xff\xfe\x00", "x.json")
    csv_bad = (
        "layer,type,forward_ms,backward_input_ms,backward_weight_ms,activation_mib,"
        "weight_mib,output_mib\n0,mlp,1,1,abc,1,1,1\n"
    )
    with pytest.raises(OctoPipeError, match=r"row 2\.backward_weight_ms"):
        parse_profile_csv(csv_bad, "x.csv")
    with pytest.raises(OctoPipeError, match="missing column"):
        parse_profile_csv("layer,type\n0,mlp\n", "x.csv")
    with pytest.raises(OctoPipeError, match="other costs"):
        parse_profile_csv(
            "type,forward_ms,backward_input_ms,backward_weight_ms,activation_mib,weight_mib,"
            "output_mib\nmlp,1,1,1,1,1,1\nmlp,2,1,1,1,1,1\n",
            "x.csv",
        )
    with pytest.raises(OctoPipeError, match="sample 'nope'"):
        load_sample("nope")


def test_keys_from_a_file_are_quoted_and_shortened_in_errors() -> None:
    import json

    from octopipe_core.cluster import parse_cluster_bytes
    from octopipe_core.errors import OctoPipeError
    from octopipe_core.profile import example_profile_dict, parse_profile_bytes

    for key in ("a\nb", "\x1b[2J", "k" * 5000):
        raw = json.dumps({**example_profile_dict(), key: 1}).encode()
        with pytest.raises(OctoPipeError) as e:
            parse_profile_bytes(raw, "p.json")
        msg = str(e.value)
        assert "\n" not in msg and "\x1b" not in msg and len(msg) < 600, msg[:80]
        assert "unknown key" in msg and "fix:" in msg
        with pytest.raises(OctoPipeError) as e:
            parse_cluster_bytes(json.dumps({key: 1}).encode(), "c.json")
        msg = str(e.value)
        assert "\n" not in msg and "\x1b" not in msg and len(msg) < 600, msg[:80]
