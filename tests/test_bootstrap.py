"""The bootstrap's decisions and command lines — no real venv is created here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dtlab import bootstrap
from dtlab import bootstrap_decisions as decisions

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "dtlab"\n')
    return tmp_path


class FakeShell:
    """Stands in for subprocess: records commands; `python -m venv` makes the venv's python."""

    def __init__(self, returncode: int = 0):
        self.commands: list[list[str]] = []
        self.envs: list[dict | None] = []
        self.returncode = returncode

    def run(self, command, cwd=None, check=False, env=None):
        self.commands.append(list(command))
        if command[1:3] == ["-m", "venv"]:
            python = decisions.venv_executable(Path(command[-1]), "python")
            python.parent.mkdir(parents=True)
            python.write_text("")
        return subprocess.CompletedProcess(command, 0)

    def call(self, command, cwd=None, env=None):
        self.commands.append(list(command))
        self.envs.append(env)
        return self.returncode


@pytest.fixture
def shell(monkeypatch, checkout) -> FakeShell:
    fake = FakeShell(returncode=3)
    monkeypatch.setattr(bootstrap.subprocess, "run", fake.run)
    monkeypatch.setattr(bootstrap.subprocess, "call", fake.call)
    monkeypatch.setattr(bootstrap, "REPO_ROOT", checkout)
    monkeypatch.setattr(bootstrap, "launcher_torch_version", lambda: None)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: None)
    monkeypatch.setattr(bootstrap.platform, "system", lambda: "Linux")
    return fake


def test_old_python_gets_a_message_naming_the_minimum():
    assert "Python >= 3.10" in decisions.python_problem((3, 9, 18))
    assert decisions.python_problem((3, 10, 0)) is None


def test_supported_torch_range_matches_pyproject():
    pin = re.search(r'"torch>=(\d+)\.(\d+),<(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    low, high_exclusive = (int(pin[1]), int(pin[2])), (int(pin[3]), int(pin[4]))
    assert decisions.SUPPORTED_TORCH[0] == low
    assert (decisions.SUPPORTED_TORCH[1][0], decisions.SUPPORTED_TORCH[1][1] + 1) == high_exclusive
    assert decisions.torch_version_supported(decisions.DEFAULT_TORCH.split("==")[1])


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("2.13.0+cpu", True),
        ("2.11.0", True),
        ("2.14.1+cu126", True),
        ("2.10.0", False),
        ("2.15.0", False),
        ("nightly", False),
    ],
)
def test_torch_versions_outside_the_supported_range_are_not_reused(version, supported):
    assert decisions.torch_version_supported(version) is supported


def test_a_supported_launcher_torch_is_kept_through_system_site_packages(checkout):
    plan = decisions.make_plan(checkout, launcher_torch="2.13.0+cu126", has_nvidia_driver=True)
    assert plan.reuse_launcher_torch
    assert "--system-site-packages" in plan.create_venv_command()


def test_a_torch_inside_a_launching_venv_cannot_be_kept(checkout):
    plan = decisions.make_plan(checkout, launcher_torch="2.13.0", launcher_in_venv=True)
    assert not plan.reuse_launcher_torch
    assert "--system-site-packages" not in plan.create_venv_command()


def test_driverless_linux_pins_torch_to_the_cpu_index(checkout):
    plan = decisions.make_plan(checkout, system="Linux", has_nvidia_driver=False)
    command = plan.install_torch_command()
    assert command[-3:] == ["torch==2.13.0", "--index-url", decisions.CPU_TORCH_INDEX]


@pytest.mark.parametrize(
    ("system", "driver", "override", "index"),
    [
        ("Linux", True, None, None),
        ("Darwin", False, None, None),
        ("Linux", False, "pypi", None),
        ("Linux", False, "https://x/cu126", "https://x/cu126"),
    ],
)
def test_torch_index_is_pypi_with_a_gpu_driver_or_off_linux_or_as_overridden(
    system, driver, override, index
):
    assert decisions.choose_torch_index(system, driver, override) == index


def test_stamp_changes_with_pyproject_and_with_the_torch_choice(checkout):
    first = decisions.make_plan(checkout).stamp
    assert decisions.make_plan(checkout).stamp == first
    assert decisions.make_plan(checkout, torch_spec="torch==2.12.0").stamp != first
    (checkout / "pyproject.toml").write_text('[project]\nname = "dtlab"\nversion = "2"\n')
    assert decisions.make_plan(checkout).stamp != first


def test_test_environment_defaults_to_fast_mode_but_keeps_a_chosen_mode():
    assert decisions.test_environment({"PATH": "/bin"})["DTLAB_MODE"] == "fast"
    assert decisions.test_environment({"DTLAB_MODE": "full"})["DTLAB_MODE"] == "full"


def test_the_whole_suite_runs_as_browser_tests_beside_everything_else(checkout):
    plan = decisions.make_plan(checkout)
    streams = decisions.test_streams(plan, [], {})
    assert streams[0][-2:] == ["-m", "not browser"] and streams[1][-4:-2] == ["-m", "browser"]
    assert decisions.test_streams(plan, ["-x", "tests/test_cli.py"], {}) == [
        decisions.test_command(plan, ["-x", "tests/test_cli.py"])
    ]
    assert len(decisions.test_streams(plan, [], {"DTLAB_TEST_SERIAL": "1"})) == 1


def test_side_by_side_runs_fail_when_either_fails_or_runs_no_tests():
    assert decisions.combined_exit_status([0, 0]) == 0
    assert decisions.combined_exit_status([0, 1]) == 1
    assert decisions.combined_exit_status([5, 0]) == 5  # "no tests ran" never passes silently
    assert decisions.combined_exit_status([2, 1]) == 2


def test_side_by_side_prints_the_second_streams_log_and_combines_statuses(tmp_path, capsys):
    import sys

    ok = [sys.executable, "-c", "print('first ran')"]
    failing = [sys.executable, "-c", "import sys; print('second ran'); sys.exit(3)"]
    code = bootstrap.run_side_by_side([ok, failing], tmp_path, dict(os.environ))
    out = capsys.readouterr().out
    assert code == 3 and "second ran" in out
    assert (tmp_path / "build" / "test-browser.log").read_text().strip() == "second ran"


def test_first_run_creates_venv_installs_torch_then_dtlab_and_runs_pytest(shell, checkout):
    status = bootstrap.main(["test", "-x", "tests/test_cli.py"])
    venv_python = str(decisions.venv_executable(checkout / ".venv", "python"))
    create, torch, dtlab, pytest_run = shell.commands
    assert create[1:] == ["-m", "venv", str(checkout / ".venv")]
    assert torch[:4] == [venv_python, "-m", "pip", "install"] and "torch==2.13.0" in torch
    assert dtlab == [venv_python, "-m", "pip", "install", "-e", ".[dev]"]
    assert pytest_run == [venv_python, "-m", "pytest", "-x", "tests/test_cli.py"]
    assert shell.envs[-1]["DTLAB_MODE"] in ("fast", "full")
    assert status == 3  # pytest's exit status comes back unchanged


def test_second_run_skips_the_install_because_the_stamp_matches(shell, checkout):
    bootstrap.main(["install"])
    shell.commands.clear()
    assert bootstrap.main(["lab", "--no-browser"]) == 3
    python = str(decisions.venv_executable(checkout / ".venv", "python"))
    assert shell.commands == [[python, "-m", "dtlab.cli", "lab", "--no-browser"]]


def test_lab_options_with_spaced_values_reach_jupyterlab_in_order(shell, checkout, monkeypatch):
    from dtlab.cli import lab, main

    bootstrap.main(["install"])
    shell.commands.clear()
    bootstrap.main(["lab", "--no-browser", "--port", "8899", "--tor", "x"])
    (dtlab_lab,) = shell.commands
    assert dtlab_lab[-6:] == ["lab", "--no-browser", "--port", "8899", "--tor", "x"]
    # ... and `dtlab lab` then reads 8899 as the port, not as a lab number.
    started = []
    monkeypatch.setattr(lab.subprocess, "call", lambda command, cwd: started.append(command) or 0)
    assert main(dtlab_lab[3:]) == 0
    assert started[0][-5:] == ["--no-browser", "--port", "8899", "--tor", "x"]


def test_editing_pyproject_reinstalls_into_the_existing_venv(shell, checkout):
    bootstrap.main(["install"])
    (checkout / "pyproject.toml").write_text('[project]\nname = "dtlab"\nversion = "2"\n')
    shell.commands.clear()
    bootstrap.main(["install"])
    assert not any(c[1:3] == ["-m", "venv"] for c in shell.commands)
    assert shell.commands[-1][-2:] == ["-e", ".[dev]"]


def test_failed_install_step_returns_its_exit_status(monkeypatch, shell):
    def failing_run(command, cwd=None, check=False, env=None):
        raise subprocess.CalledProcessError(7, command)

    monkeypatch.setattr(bootstrap.subprocess, "run", failing_run)
    assert bootstrap.main(["install"]) == 7


def test_bootstrap_runs_on_the_standard_library_alone():
    # -S: no site-packages at all, so neither dtlab nor torch is importable.
    done = subprocess.run(
        [sys.executable, "-S", str(REPO / "lib" / "dtlab" / "bootstrap.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "lab" in done.stdout and "test" in done.stdout


def test_unreachable_cpu_index_falls_back_to_pips_configured_index():
    from dtlab.bootstrap_decisions import CPU_TORCH_INDEX, choose_torch_index

    assert choose_torch_index("Linux", False, None, cpu_index_reachable=True) == CPU_TORCH_INDEX
    assert choose_torch_index("Linux", False, None, cpu_index_reachable=False) is None
    assert (
        choose_torch_index("Linux", False, "https://mirror/simple", False)
        == "https://mirror/simple"
    )


def test_run_as_a_script_the_bootstrap_loads_its_decisions_by_path_without_dtlab():
    # -S: neither dtlab nor torch is importable, as on a clean clone before the install.
    code = (
        "import runpy, sys; ns = runpy.run_path('lib/dtlab/bootstrap.py'); d = ns['decisions']; "
        "print(d.__name__, d.choose_torch_index('Linux', False, None), 'dtlab' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["_dtlab_bootstrap_decisions", decisions.CPU_TORCH_INDEX, "False"]


def test_the_bootstrap_imports_only_the_standard_library_before_dtlab_is_installed():
    import ast

    for name in ("bootstrap.py", "bootstrap_decisions.py"):
        tree = ast.parse((REPO / "lib" / "dtlab" / name).read_text())
        guarded = {  # `if __package__:` — only when imported as part of an installed dtlab
            id(node)
            for branch in ast.walk(tree)
            if isinstance(branch, ast.If) and ast.unparse(branch.test) == "__package__"
            for node in ast.walk(ast.Module(body=branch.body, type_ignores=[]))
        }
        for node in ast.walk(tree):
            if id(node) in guarded or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            modules = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            for module in modules:
                top = module.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (
                    f"lib/dtlab/{name}:{node.lineno} imports {module}, which a bare python3 "
                    "does not have before the install"
                )
