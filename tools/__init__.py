"""Repository tools. The repository root is the import root: run them as ``python -m tools.<name>`` from there
(build.sh does: ``python -m tools.dcubuild``); tests import them through pytest.ini's ``pythonpath = .``."""
