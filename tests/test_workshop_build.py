"""One lab source builds two notebooks: the solution, and a student edition with no solutions."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest

import dtlab.files
from dtlab.workshop.build import (
    BUILD_COMMAND,
    build,
    lab_sources,
    render_notebook,
    stale_notebooks,
)
from dtlab.workshop.exercises import list_exercises
from dtlab.workshop.solution_blocks import student_source
from dtlab.workshop.source import LabSourceError, parse_lab_source, read_lab_source

REPO = Path(__file__).resolve().parents[1]

LAB = '''\
# ---
# jupyter: a jupytext header is ignored
# ---

# %% [markdown]
# # Lab 99
#
# Prose before the output.

# %% Setup tags=["setup"]
import torch

# %%
def double(x):
    """Twice x."""
    # BEGIN SOLUTION
    secret_answer = x * 2
    return secret_answer
    # END SOLUTION


class Helper:
    def method(self):
        # BEGIN SOLUTION
        return "hidden_method_body"
        # END SOLUTION

# %% tags=["graded"]
dtlab.quiz.check_exercise("demo.double", double, cluster)
'''


def parse(text: str = LAB, name: str = "99_demo.py"):
    return parse_lab_source(text, Path("solutions") / name)


def solution_lines(text: str) -> list[str]:
    """Every non-blank line strictly between BEGIN and END SOLUTION markers."""
    inside, found = False, []
    for line in text.splitlines():
        if "BEGIN SOLUTION" in line:
            inside = True
        elif "END SOLUTION" in line:
            inside = False
        elif inside and _is_telling(line.strip()):
            found.append(line.strip())
    return found


def _is_telling(line: str) -> bool:
    """A line that could only come from the solution: not a bracket, `return x` or `pass`."""
    return sum(ch.isalnum() for ch in line) >= 8


def sources_of(notebook_text: str) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(notebook_text)["cells"])


def test_percent_source_splits_into_markdown_and_code_cells_with_metadata():
    lab = parse()
    assert [c.cell_type for c in lab.cells] == ["markdown", "code", "code", "code"]
    assert lab.cells[0].source == "# Lab 99\n\nProse before the output."
    assert lab.cells[1].metadata == {"tags": ["setup"], "title": "Setup"}
    assert lab.cells[1].line == 11  # first body line, for file:line errors
    assert lab.cells[3].tags == ["graded"]


def test_markdown_line_without_comment_prefix_is_an_error_naming_the_line():
    with pytest.raises(LabSourceError, match=r"99_demo.py:3: .*'# '"):
        parse("# %% [markdown]\n# fine\nnot a comment\n")


def test_malformed_cell_metadata_is_an_error_naming_the_marker_line():
    with pytest.raises(LabSourceError, match=r"99_demo.py:2: .*not JSON"):
        parse("# %%\n# %% tags=['single-quoted']\nx = 1\n")


def test_student_edition_replaces_each_solution_block_at_its_indentation():
    lab = parse()
    student = student_source(lab.cells[2], lab.path, 2).splitlines()
    assert student[0] == "from dtlab.workshop.stubs import ExerciseNotWritten"
    assert (
        student[4] == '    raise ExerciseNotWritten("double")  # replace this line with your code'
    )
    assert student[-1] == (
        '        raise ExerciseNotWritten("Helper.method")  # replace this line with your code'
    )
    assert '"""Twice x."""' in student[3]  # the docstring is the student's specification


def test_a_fallback_marker_wraps_the_function_in_the_student_edition_only():
    lab = parse(
        LAB.replace(
            "    # BEGIN SOLUTION\n    secret",
            "    # BEGIN SOLUTION fallback=operator:neg\n    secret",
        )
    )
    student = student_source(lab.cells[2], lab.path, 2).splitlines()
    assert student[0] == "from dtlab.workshop.stubs import ExerciseNotWritten, until_written"
    assert student[2:4] == ['@until_written(fallback="operator:neg")', "def double(x):"]
    assert "until_written" not in sources_of(render_notebook(lab, "solution"))
    namespace: dict = {}
    exec("\n".join(student), namespace)
    assert namespace["double"](3) == -3  # the stand-in, until the learner writes double


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("        # BEGIN SOLUTION fallback=operator:neg", r"99_demo.py:\d+: a fallback needs"),
        ("        # BEGIN SOLUTION fallback=operator", r"99_demo.py:\d+: cannot read"),
    ],
)
def test_a_fallback_outside_a_top_level_function_or_malformed_is_a_build_error(marker, message):
    text = LAB.replace(
        '        # BEGIN SOLUTION\n        return "hidden', marker + '\n        return "hidden'
    )
    with pytest.raises(LabSourceError, match=message):
        render_notebook(parse(text), "student")


def test_a_later_cell_calling_an_exercise_without_a_fallback_is_a_build_error(tmp_path: Path):
    calls_it = LAB + "\n# %%\nprint(double(2))\n"
    write_lab(tmp_path, text=calls_it)
    with pytest.raises(LabSourceError, match=r"99_demo.py:\d+: this cell calls double\(\)"):
        build(tmp_path)
    declared = calls_it.replace(
        "    # BEGIN SOLUTION\n    secret", "    # BEGIN SOLUTION fallback=operator:neg\n    secret"
    )
    write_lab(tmp_path, text=declared)
    assert build(tmp_path)


def test_student_notebook_contains_no_solution_text():
    lab = parse()
    student = sources_of(render_notebook(lab, "student"))
    hidden = solution_lines(LAB)
    assert hidden == [
        "secret_answer = x * 2",
        "return secret_answer",
        'return "hidden_method_body"',
    ]
    for line in hidden:
        assert line not in student
    assert "SOLUTION" not in student


def test_solution_notebook_keeps_every_solution_line():
    complete = sources_of(render_notebook(parse(), "solution"))
    for line in solution_lines(LAB):
        assert line in complete


@pytest.mark.parametrize("source", lab_sources(REPO), ids=lambda p: p.stem)
def test_no_committed_student_notebook_leaks_a_solution(source: Path):
    student_notebook = REPO / "labs" / f"{source.stem}.ipynb"
    student = sources_of(student_notebook.read_text(encoding="utf-8"))
    for line in solution_lines(source.read_text(encoding="utf-8")):
        assert line not in student, f"{student_notebook.name} shows solution line {line!r}"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n", r"99_demo.py:5: .*never closed"),
        ("def f():\n    return 1\n    # END SOLUTION\n", r"99_demo.py:6: .*without a"),
        (
            "def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n",
            r"99_demo.py:6: .*inside the block opened at line 5",
        ),
        ("def f():\n    #BEGIN SOLUTION (loose)\n    return 1\n", r"99_demo.py:5: .*never closed"),
    ],
    ids=["begin-without-end", "end-without-begin", "nested-begin", "loose-marker-still-a-marker"],
)
def test_unbalanced_solution_markers_are_a_build_error_naming_file_and_line(body, message):
    lab = parse("# %%\nimport torch\n# %%\n" + body)
    with pytest.raises(LabSourceError, match=message):
        render_notebook(lab, "student")


def test_notebooks_are_valid_nbformat_45_with_stable_ids_and_no_outputs():
    lab = parse()
    for edition in ("solution", "student"):
        text = render_notebook(lab, edition)
        assert text == render_notebook(parse(), edition)  # byte-for-byte deterministic
        notebook = nbformat.reads(text, as_version=4)
        nbformat.validate(notebook)
        assert (notebook.nbformat, notebook.nbformat_minor) == (4, 5)
        assert notebook.metadata.kernelspec.name == "python3"
        assert [c.id for c in notebook.cells] == [f"99_demo-{i:03d}" for i in range(4)]
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert all(c.outputs == [] and c.execution_count is None for c in code)


def write_lab(root: Path, name: str = "99_demo", text: str = LAB) -> Path:
    (root / "solutions").mkdir(exist_ok=True)
    (root / "labs").mkdir(exist_ok=True)
    path = root / "solutions" / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


def test_check_lists_missing_stale_and_orphaned_notebooks_until_rebuilt(tmp_path: Path):
    source = write_lab(tmp_path)
    assert stale_notebooks(tmp_path) == [
        "solutions/99_demo.ipynb is missing",
        "labs/99_demo.ipynb is missing",
    ]
    written = build(tmp_path)
    assert sorted(p.name for p in written) == ["99_demo.ipynb", "99_demo.ipynb"]
    assert stale_notebooks(tmp_path) == []
    assert build(tmp_path) == []  # idempotent: nothing rewritten

    source.write_text(LAB.replace("Prose before", "New prose before"), encoding="utf-8")
    (tmp_path / "labs" / "98_gone.ipynb").write_text("{}")
    problems = stale_notebooks(tmp_path)
    assert "solutions/99_demo.ipynb differs from its source solutions/99_demo.py" in problems
    assert "labs/99_demo.ipynb differs from its source solutions/99_demo.py" in problems
    assert any(p.startswith("labs/98_gone.ipynb has no source") for p in problems)


def crash_half_way(fd: int, data: bytes) -> None:
    """Stands in for :func:`dtlab.files.write_all`: a kill or a full disk mid-write."""
    os.write(fd, bytes(data[: len(data) // 2]))
    raise KeyboardInterrupt


def test_build_replaces_notebooks_whole_and_an_interrupted_build_leaves_them_intact(
    tmp_path: Path, monkeypatch
):
    source = write_lab(tmp_path)
    build(tmp_path)
    notebook = tmp_path / "labs" / "99_demo.ipynb"
    old = notebook.read_bytes()
    source.write_text(LAB.replace("Prose before", "New prose before"), encoding="utf-8")
    with notebook.open("rb") as reader_of_the_old_notebook:
        build(tmp_path)
        assert reader_of_the_old_notebook.read() == old  # a new file, not the old one rewritten
    new = notebook.read_bytes()
    assert b"New prose" in new

    source.write_text(LAB.replace("Prose before", "Third prose before"), encoding="utf-8")
    monkeypatch.setattr(dtlab.files, "write_all", crash_half_way)
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path)
    assert notebook.read_bytes() == new
    nbformat.validate(nbformat.reads(new.decode(), as_version=4))
    assert sorted(os.listdir(tmp_path / "labs")) == ["99_demo.ipynb"]  # no temp file left
    assert sorted(os.listdir(tmp_path / "solutions")) == ["99_demo.ipynb", "99_demo.py"]


def test_an_exercise_cell_with_a_statement_is_a_build_error(tmp_path: Path):
    broken = LAB.replace("class Helper:", "cluster = dtlab.Cluster(2)\n\n\nclass Helper:")
    write_lab(tmp_path, text=broken)
    with pytest.raises(LabSourceError, match=r"99_demo.py:22: an exercise cell may hold only"):
        build(tmp_path)


def test_exercises_are_found_from_their_grading_calls():
    (exercise,) = list_exercises(parse())
    assert (exercise.exercise_id, exercise.function_name) == ("demo.double", "double")
    assert exercise.setup_code == "import torch"
    assert "secret_answer" in exercise.solution_code
    assert "secret_answer" not in exercise.student_code


def test_grading_a_function_no_exercise_cell_defines_is_an_error():
    lab = parse(LAB.replace('"demo.double", double', '"demo.triple", triple'))
    with pytest.raises(LabSourceError, match=r"'demo.triple' grades 'triple'"):
        list_exercises(lab)


def test_committed_notebooks_match_their_sources():
    problems = stale_notebooks(REPO)
    assert not problems, f"run `{BUILD_COMMAND}`:\n" + "\n".join(problems)


@pytest.mark.parametrize("source", lab_sources(REPO), ids=lambda p: p.stem)
def test_every_lab_source_parses_and_its_first_cell_is_prose(source: Path):
    lab = read_lab_source(source)
    assert lab.cells[0].cell_type == "markdown", "open a lab with a title and what it teaches"


# DESIGN: a lab cell never says "gloo" or "cuda" unless it is teaching the difference. Lab 00's
# section 2 (a rank per GPU talking NCCL, or ranks on the CPU talking gloo) is where it is taught.
BACKEND_WORDS = re.compile(r"\b(gloo|cuda)\b", re.IGNORECASE)
TEACHES_THE_BACKENDS = {("00_setup", "## 2. Start a cluster")}
AUDITED_LABS = (
    "00_setup",
    "01_collectives",
    "02_data_parallel",
    "03_zero_fsdp",
    "04_tensor_parallel",
    "05_pipeline_parallel",
    "06_context_parallel",
    "07_mixture_of_experts",
    "08_mixed_precision",
    "09_activation_memory",
    "10_checkpointing",
    "11_composition",
    "12_overlap",
    "13_accelerator_runtime",
    "14_capstone",
)  # add each lab here once its text is audited (#11)


@pytest.mark.parametrize("name", AUDITED_LABS)
def test_lab_cells_say_the_backend_not_gloo_or_cuda_outside_the_section_teaching_it(name: str):
    lab = read_lab_source(REPO / "solutions" / f"{name}.py")
    section = ""
    for cell in lab.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            section = cell.source.splitlines()[0]
        found = BACKEND_WORDS.search(cell.source)
        assert not found or (name, section) in TEACHES_THE_BACKENDS, (
            f"solutions/{name}.py:{cell.line} says {found[0]!r}; write 'the backend' or "
            "'the device', or teach the difference in a section listed in TEACHES_THE_BACKENDS"
        )
