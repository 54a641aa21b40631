"""No tracked file names a path of one machine (under root's or a user's home, the temporary folder or the workplace):
results, logs, plans, docs and code say `<tmp>/...`, `<out>`, `<repo>` or a path relative to the repository
(bench/machine_paths.py). The examples here are built from the folders' names, so no file is exempt."""
import os
import re
import subprocess

from bench.machine_paths import ADMIN_HOME, HOMES, TMP, WORK, find, host_path, scrub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tracked_text_files():
    out = subprocess.run(["git", "-C", REPO, "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in out.decode().split("\0"):
        if not rel:
            continue
        try:
            with open(os.path.join(REPO, rel), "rb") as f:
                data = f.read()
        except (FileNotFoundError, IsADirectoryError):
            continue  # deleted in the work tree, or a submodule
        if b"\0" in data:
            continue  # binary (PNG, tarballs); their text members were scrubbed before packing
        yield rel, data.decode("utf-8", errors="replace")


def test_no_tracked_file_names_a_machine_path():
    hits = [f"{rel}: {line}" for rel, text in tracked_text_files() for line in find(text)]
    assert not hits, f"{len(hits)} machine path(s), first: " + "\n".join(hits[:10])


def test_the_pattern_finds_host_paths_and_leaves_relative_and_device_paths():
    for bad in (f"--out {host_path(ADMIN_HOME, 'out')}", f"log {host_path(TMP, 'jobs-res/a.log')}",
                host_path(HOMES, "me/x"), f"PYTHONPATH={host_path(WORK, 'main')}:x",
                f'"work": "{host_path(TMP, "jobs-work/contest")}"'):
        assert find(bad), bad
    for good in ("bench/results/raw/x.log", "/dev/shm", "<tmp>/jobs-res/a", "$TMPDIR/x", "framework/tmp/x",
                 "/usr/local/cuda/bin", "/opt/nvidia/nsight-compute"):
        assert not find(good), good


def test_scrub_names_each_folder_by_its_role():
    assert scrub(f"--out {host_path(ADMIN_HOME, 'out')} --work {host_path(TMP, 'jobs-work/e2e')}") == \
        "--out <out> --work <tmp>/jobs-work/e2e"
    main = host_path(WORK, "main")
    assert scrub(f"PYTHONPATH={host_path(TMP, 'variants/full')}:{main}:{main}/ci/gpu/diag") == \
        "PYTHONPATH=<tmp>/variants/full:<repo>:<repo>/ci/gpu/diag"
    assert not find(scrub(" ".join((host_path(HOMES, "someone/.cache/x"), host_path(ADMIN_HOME, ".triton/cache"),
                                    host_path(WORK, ".device/y")))))


def test_the_results_tree_holds_data_and_logs_not_experiment_code():
    """bench/results keeps what runs produced; the code of a dropped attempt lives in git history (docs/measurements.md
    names its commit), so no kernel, diff, script or plan is tracked there."""
    files = subprocess.run(["git", "ls-files", "bench/results"], capture_output=True, text=True, check=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.split()
    code = [f for f in files if f.endswith((".py", ".diff", ".patch", ".sh", ".jobs", ".cu", ".cpp"))]
    assert files and not code, code[:10]


def test_the_results_index_names_a_file_that_exists_for_every_area():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results")
    text = open(os.path.join(root, "README.md")).read()
    links = re.findall(r"\]\(([^)#]+\.md)\)", text)
    assert len(links) >= 10
    missing = [link for link in links if not os.path.isfile(os.path.normpath(os.path.join(root, link)))]
    assert not missing, missing
