"""kernels/targets.py: the launch-parameter entry a device gets, and the override JSON every launch table reads."""
import pytest

from kernels import targets


@pytest.mark.parametrize("arch,want", [("sm90", "sm90"), ("sm80", "cuda"), ("gfx936", "gfx936"), ("gfx942", "rocm"),
                                       ("interpreter", "interpreter")])
def test_known_archs_get_their_entry_and_others_the_generic_one(monkeypatch, arch, want):
    monkeypatch.setattr(targets, "device_arch", lambda device=None: arch)
    assert targets.target_for({"sm90", "gfx936", "cuda", "rocm", "interpreter"}) == want


def test_interpreter_needs_no_device(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert targets.device_arch() == "interpreter"


@pytest.mark.parametrize("text,msg", [("{", "VAR is not valid JSON"), ("[1]", "VAR must be a JSON object"),
                                      ('{"b": 1}', r"VAR: unknown key\(s\) \['b'\]; allowed: \['a'\]")])
def test_override_errors_name_the_variable(text, msg):
    with pytest.raises(ValueError, match=msg):
        targets.parse_override_object("VAR", text, {"a"})
    assert targets.parse_override_object("VAR", '{"a": 2}', {"a"}) == {"a": 2}


def test_entries_are_built_once_per_target_and_override(monkeypatch):
    built, cache = [], {}

    def build(target, text):
        built.append((target, text))
        return {"t": target, "text": text}

    monkeypatch.setenv("VAR", '{"a": 1}')
    first = targets.cached_entry(cache, "VAR", build, "sm90")
    assert first == {"t": "sm90", "text": '{"a": 1}'} and targets.cached_entry(cache, "VAR", build, "sm90") is first
    assert targets.cached_entry(cache, "VAR", build, "sm90", override="")["text"] == ""
    assert built == [("sm90", '{"a": 1}'), ("sm90", "")]
