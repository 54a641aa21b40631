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
