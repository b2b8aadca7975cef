"""The `dtlab` command, driven in-process through ``main([...])``."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

import dtlab.bench
from dtlab.cli import doctor, lab, main, subcommand_modules

LAB_SOURCE = textwrap.dedent(
    """\
    # %% [markdown]
    # # Lab 99

    # %%
    import torch
    """
)


def test_subcommands_are_discovered_one_module_each():
    assert {"bench", "doctor", "lab", "workshop"} <= set(subcommand_modules())


def test_no_subcommand_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "doctor" in capsys.readouterr().out


def test_unknown_option_of_a_strict_subcommand_is_rejected():
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--bogus"])
    assert exited.value.code == 2


def test_doctor_json_reports_every_check_and_succeeds_here(capsys):
    assert main(["doctor", "--json", "--no-gloo"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in report["checks"]]
    assert report["ok"] is True
    for name in (
        "python",
        "torch",
        "cuda",
        "plotly",
        "ipywidgets",
        "jupyterlab",
        "nbval",
        "lab mode",
    ):
        assert name in names


def test_doctor_exits_1_and_says_what_to_fix_when_something_essential_fails(monkeypatch, capsys):
    missing = doctor.Check("plotly", False, "not installed", "pip install plotly", essential=True)
    monkeypatch.setattr(doctor, "check_packages", lambda: [missing])
    assert main(["doctor", "--no-gloo"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  plotly" in out and "fix: pip install plotly" in out


def test_doctor_only_warns_when_an_optional_package_is_missing(monkeypatch, capsys):
    missing = doctor.Check("nbval", False, "not installed", "pip install nbval", essential=False)
    monkeypatch.setattr(doctor, "check_packages", lambda: [missing])
    assert main(["doctor", "--no-gloo"]) == 0
    assert "WARN  nbval" in capsys.readouterr().out


def test_doctor_gloo_self_test_all_reduces_on_two_real_ranks():
    check = doctor.check_gloo(world_size=2)
    assert check.ok, check.detail
    assert "[3.0, 3.0]" in check.detail and "cold start" in check.detail


def test_bench_lists_and_dispatches_to_a_benchmark_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "echo_args.py").write_text(
        '"""Echo the arguments (a test benchmark)."""\n'
        "def main(argv):\n    print('got', argv)\n    return 4\n"
    )
    monkeypatch.setattr(dtlab.bench, "__path__", [*dtlab.bench.__path__, str(tmp_path)])
    assert main(["bench"]) == 0
    assert re.search(
        r"echo_args +Echo the arguments \(a test benchmark\)\.", capsys.readouterr().out
    )
    assert main(["bench", "echo_args", "--size", "8", "--help"]) == 4
    assert "got ['--size', '8', '--help']" in capsys.readouterr().out
    assert main(["bench", "echo-args"]) == 4  # a hyphen names the module's underscore
    assert "got []" in capsys.readouterr().out


def test_bench_with_an_unknown_name_lists_the_real_ones(capsys):
    assert main(["bench", "no_such_bench"]) == 2
    assert "no benchmark named 'no_such_bench'" in capsys.readouterr().out


def test_workshop_build_check_fails_on_stale_notebooks_and_passes_after_build(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "labs").mkdir()
    (tmp_path / "solutions" / "99_demo.py").write_text(LAB_SOURCE)
    root = ["--root", str(tmp_path)]
    assert main(["workshop", "build", "--check", *root]) == 1
    out = capsys.readouterr().out
    assert "labs/99_demo.ipynb is missing" in out and "dtlab workshop build" in out
    assert main(["workshop", "build", *root]) == 0
    assert (tmp_path / "labs" / "99_demo.ipynb").exists()
    assert main(["workshop", "build", "--check", *root]) == 0


def test_workshop_build_reports_a_source_error_with_file_and_line(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "99_demo.py").write_text(
        LAB_SOURCE + "\n# %%\ndef f():\n    # BEGIN SOLUTION\n    return 1\n"
    )
    assert main(["workshop", "build", "--root", str(tmp_path)]) == 1
    assert "99_demo.py:9: '# BEGIN SOLUTION' is never closed" in capsys.readouterr().out


def test_lab_finds_a_notebook_by_number(tmp_path: Path):
    for name in ("00_setup", "03_zero"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    assert lab.find_lab(tmp_path, "3").name == "03_zero.ipynb"
    assert lab.find_lab(tmp_path, "00").name == "00_setup.ipynb"
    with pytest.raises(FileNotFoundError, match="the labs are: 00_setup, 03_zero"):
        lab.find_lab(tmp_path, "7")


def test_lab_starts_jupyterlab_in_labs_and_passes_options_through(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(
        lab.subprocess, "call", lambda command, cwd: started.append((command, cwd)) or 0
    )
    monkeypatch.setattr(lab, "find_lab", lambda labs_dir, number: labs_dir / f"{number}_x.ipynb")
    assert main(["lab", "05", "--no-browser", "--port=8899"]) == 0
    ((command, cwd),) = started
    assert command[1:3] == ["-m", "jupyterlab"]
    assert command[-3:] == ["05_x.ipynb", "--no-browser", "--port=8899"]
    assert f"--ServerApp.root_dir={cwd}" in command and cwd.name == "labs"


@pytest.mark.parametrize(
    ("arguments", "lab_name", "jupyter"),
    [
        (["--no-browser", "--port", "8899"], None, ["--no-browser", "--port", "8899"]),
        (["--no-browser", "--port=8899"], None, ["--no-browser", "--port=8899"]),
        (["3", "--port", "8899"], "03_zero.ipynb", ["--port", "8899"]),
        (
            ["03", "--ip", "0.0.0.0", "--no-browser"],
            "03_zero.ipynb",
            ["--ip", "0.0.0.0", "--no-browser"],
        ),
        (["03_zero", "--port", "12"], "03_zero.ipynb", ["--port", "12"]),
        (["--port", "12", "3"], None, ["--port", "12", "3"]),  # a lab number only comes first
        (["8899"], None, ["8899"]),  # more than two digits: never a lab number
        ([], None, []),
    ],
)
def test_lab_number_is_only_a_leading_bare_number_the_rest_goes_to_jupyterlab_in_order(
    tmp_path: Path, arguments, lab_name, jupyter
):
    for name in ("00_setup", "03_zero"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    lab_path, extra = lab.split_arguments(tmp_path, arguments)
    assert (lab_path.name if lab_path else None) == lab_name
    assert extra == jupyter


def test_lab_with_a_spaced_port_starts_jupyterlab_on_all_labs_with_that_port(monkeypatch):
    started = []
    monkeypatch.setattr(
        lab.subprocess, "call", lambda command, cwd: started.append((command, cwd)) or 0
    )
    assert main(["lab", "--no-browser", "--port", "8899"]) == 0
    ((command, cwd),) = started
    assert command[-3:] == ["--no-browser", "--port", "8899"]
    assert not any(part.endswith(".ipynb") for part in command)


def test_lab_with_a_number_that_names_no_lab_lists_the_labs(tmp_path: Path):
    (tmp_path / "03_zero.ipynb").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no lab '7'.*03_zero"):
        lab.split_arguments(tmp_path, ["7", "--port", "8899"])


def test_lab_as_root_adds_allow_root_once(monkeypatch):
    monkeypatch.setattr(lab, "running_as_root", lambda: True)
    assert lab.jupyter_command(Path("labs"), None, []).count("--allow-root") == 1
    assert lab.jupyter_command(Path("labs"), None, ["--allow-root"]).count("--allow-root") == 1
    monkeypatch.setattr(lab, "running_as_root", lambda: False)
    assert "--allow-root" not in lab.jupyter_command(Path("labs"), None, [])


def test_doctor_reports_gpu_count_and_nccl_version_when_cuda_is_available(monkeypatch):
    import torch
    import torch.cuda.nccl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    cuda = {c.name: c for c in doctor.check_torch()}["cuda"]
    assert cuda.ok and "8 GPU(s): NVIDIA H100" in cuda.detail and "NCCL 2.21.5" in cuda.detail
