"""The question bank: the real quizzes/ load cleanly, every key recomputes, bad files are named."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from dtlab.quiz import BankError, bank_version, compute_key, load_bank, reference_problems
from dtlab.quiz.bank import cached_bank, default_quiz_dir
from dtlab.quiz.schema import KINDS

GOOD_CHOICE = """
  - id: demo.pick
    kind: choice
    difficulty: easy
    source: [seed:000#Q1]
    link: lab:00#ranks
    prompt: Pick b.
    choices:
      - {key: a, text: A, why: not a}
      - {key: b, text: B, why: b it is, correct: true}
    explanation: b is right.
"""


def write_bank(folder: Path, body: str, topic: str = "demo") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{topic}.yaml").write_text(f"topic: {topic}\nitems:\n" + textwrap.dedent(body))
    return folder


def test_repository_bank_loads_and_every_reference_resolves():
    bank = load_bank()
    assert len(bank) >= 7
    assert reference_problems(bank) == []


def test_every_numeric_key_in_the_bank_recomputes_to_a_finite_number():
    numeric = [item for item in load_bank().values() if item.kind == "numeric"]
    assert numeric, "the bank should hold numeric items"
    for item in numeric:
        value = compute_key(item)
        assert value == value and abs(value) != float("inf"), item.id


def test_setup_topic_covers_every_kind():
    kinds = {item.kind for item in load_bank().items_for("setup")}
    assert kinds == set(KINDS)


def test_default_quiz_dir_is_the_repository_quizzes_folder():
    assert default_quiz_dir() == Path(__file__).resolve().parents[1] / "quizzes"


def test_missing_why_is_reported_with_file_and_item_id(tmp_path):
    body = GOOD_CHOICE.replace("{key: a, text: A, why: not a}", "{key: c, text: A}")
    write_bank(tmp_path / "quizzes", body)
    with pytest.raises(BankError) as caught:
        load_bank(tmp_path / "quizzes")
    assert "quizzes/demo.yaml: item 'demo.pick': choice 'c' has no 'why'" in str(caught.value)


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    body = GOOD_CHOICE.replace("difficulty: easy", "difficulty: 5").replace(
        "link: lab:00#ranks", "link: nowhere"
    )
    body = body.replace("explanation: b is right.", "explaination: typo")
    write_bank(tmp_path, body)
    with pytest.raises(BankError) as caught:
        load_bank(tmp_path)
    problems = caught.value.problems
    assert any("difficulty 5 must be one of easy, medium, hard" in p for p in problems)
    assert any("link 'nowhere'" in p for p in problems)
    assert any("did you mean 'explanation'" in p for p in problems)
    assert any("missing required field 'explanation'" in p for p in problems)


def test_duplicate_ids_across_files_are_an_error(tmp_path):
    write_bank(tmp_path, GOOD_CHOICE)
    (tmp_path / "other.yaml").write_text(
        "topic: other\nitems:\n"
        + textwrap.dedent(GOOD_CHOICE).replace("id: demo.pick", "id: other.pick")
    )
    load_bank(tmp_path)  # distinct ids: fine
    clash = textwrap.dedent(GOOD_CHOICE)
    (tmp_path / "more.yaml").write_text("topic: demo\nitems:\n" + clash)
    with pytest.raises(
        BankError, match="declares topic 'demo'; it must equal the file name 'more'"
    ):
        load_bank(tmp_path)
    (tmp_path / "more.yaml").unlink()
    (tmp_path / "demo.yml").write_text("topic: demo\nitems:\n" + clash)
    with pytest.raises(BankError, match="duplicate id, already defined in"):
        load_bank(tmp_path)


def test_numeric_item_with_a_typed_answer_is_rejected(tmp_path):
    write_bank(
        tmp_path,
        """
        - id: demo.typed
          kind: numeric
          difficulty: easy
          source: [seed:000#Q1]
          link: lab:00#ranks
          prompt: How many?
          answer: 28
          explanation: typed by hand
        """,
    )
    with pytest.raises(BankError) as caught:
        load_bank(tmp_path)
    text = str(caught.value)
    assert "numeric items compute their key; replace 'answer'" in text
    assert "numeric items need a 'key' field" in text


def test_key_call_outside_dtlab_is_rejected(tmp_path):
    write_bank(
        tmp_path,
        """
        - id: demo.evil
          kind: numeric
          difficulty: easy
          source: [seed:000#Q1]
          link: lab:00#ranks
          prompt: How many?
          key: {call: "os:getpid"}
          explanation: nope
        """,
    )
    with pytest.raises(BankError, match="must be 'dtlab.module.path:function'"):
        load_bank(tmp_path)


def test_a_library_symbol_in_link_is_refused_on_load_with_the_fix(tmp_path):
    """Issue 28: ``link`` is the lab section the hint sends a learner to; a symbol goes in ``see``."""
    body = GOOD_CHOICE.replace("link: lab:00#ranks", "link: dtlab.runtime.context:device")
    with pytest.raises(BankError) as error:
        load_bank(write_bank(tmp_path / "quizzes", body))
    assert error.value.problems == [
        "quizzes/demo.yaml: item 'demo.pick': link 'dtlab.runtime.context:device' is a library symbol; "
        "'link' names the lab section that teaches the idea ('lab:03#zero-stages'): move the "
        "symbol to 'see: dtlab.runtime.context:device'"
    ]


def test_see_and_shuffle_are_read_and_checked_for_shape(tmp_path):
    with_both = GOOD_CHOICE.replace(
        "link: lab:00#ranks\n", "link: lab:00#ranks\n    see: dtlab.runtime.context:device\n"
    ).replace("prompt: Pick b.", "shuffle: false\n    prompt: Pick b.")
    item = load_bank(write_bank(tmp_path / "good", with_both))["demo.pick"]
    assert item.see == "dtlab.runtime.context:device" and item.shuffle is False
    plain = load_bank(write_bank(tmp_path / "plain", GOOD_CHOICE))["demo.pick"]
    assert plain.see == "" and plain.shuffle is True  # the defaults
    bad = with_both.replace("dtlab.runtime.context:device", "os:getcwd").replace(
        "shuffle: false", 'shuffle: "no"'
    )
    with pytest.raises(BankError) as error:
        load_bank(write_bank(tmp_path / "bad", bad))
    assert error.value.problems == [
        "bad/demo.yaml: item 'demo.pick': see 'os:getcwd' must name a library symbol, e.g. "
        "'dtlab.memory.formulas:model_state_bytes'",
        "bad/demo.yaml: item 'demo.pick': shuffle 'no' must be true or false (false keeps the "
        "options in written order)",
    ]


def test_reference_problems_name_unresolvable_keys_see_symbols_and_exercises(tmp_path):
    write_bank(
        tmp_path,
        """
        - id: demo.broken_key
          kind: numeric
          difficulty: easy
          source: [seed:000#Q1]
          link: lab:00#ranks
          see: dtlab.runtime.context:no_such_function
          prompt: How many?
          key: {call: "dtlab.quiz.graders.setup:expected_rank_sum", kwargs: {world_size: 0}}
          explanation: the call raises
        - id: demo.missing_exercise
          kind: code
          difficulty: easy
          source: [seed:000#Q1]
          link: lab:00#ranks
          prompt: Write it.
          exercise: demo.not_registered
          explanation: none
        """,
    )
    problems = reference_problems(load_bank(tmp_path))
    assert len(problems) == 3
    assert "raised ValueError: world_size must be at least 1" in problems[0]
    assert "see 'dtlab.runtime.context:no_such_function' does not resolve" in problems[1]
    assert "exercise 'demo.not_registered' is not registered" in problems[2]


def test_ordering_listed_in_correct_order_is_rejected(tmp_path):
    write_bank(
        tmp_path,
        """
        - id: demo.order
          kind: ordering
          difficulty: easy
          source: [seed:000#Q1]
          link: lab:00#ranks
          prompt: Order them.
          steps: [{key: a, text: A}, {key: b, text: B}, {key: c, text: C}]
          answer: [a, b, c]
          explanation: alphabetical
        """,
    )
    with pytest.raises(BankError, match="listed in the correct order already"):
        load_bank(tmp_path)


def test_bank_version_changes_when_a_file_changes_and_cache_reloads(tmp_path):
    write_bank(tmp_path, GOOD_CHOICE)
    first = cached_bank(tmp_path)
    assert first.version == bank_version(tmp_path)
    assert cached_bank(tmp_path) is first
    write_bank(tmp_path, GOOD_CHOICE.replace("Pick b.", "Pick b, please."))
    second = cached_bank(tmp_path)
    assert second.version != first.version
    assert second["demo.pick"].prompt == "Pick b, please."


def test_unknown_item_id_suggests_close_ids():
    with pytest.raises(KeyError, match="did you mean 'setup.world_size'"):
        load_bank()["setup.world_sise"]


def test_every_example_in_the_authors_readme_is_a_valid_item(tmp_path):
    readme = (default_quiz_dir() / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(  - id: .*?)```", readme, flags=re.DOTALL)
    assert len(blocks) == len(KINDS)
    (tmp_path / "setup.yaml").write_text("topic: setup\nitems:\n" + "".join(blocks))
    bank = load_bank(tmp_path)
    assert sorted(item.kind for item in bank.values()) == sorted(KINDS)
    assert reference_problems(bank) == []


# -- what the bank teaches: regressions for defects found in review (issue 21) ----------------


def _taught_text(item) -> str:
    """What the bank presents as true: prompt, explanation, answer and the correct options."""
    right = [c.text + " " + c.why for c in item.choices if c.correct]
    answer = item.answer if isinstance(item.answer, str) else ""
    return " ".join([item.prompt, item.explanation, answer, *right])


def test_no_item_teaches_that_a_bf16_reduction_is_exact():
    wrong = re.compile(
        r"exact means \(BF16|BF16 gradients[^.]*\bexact\b|\bexact\b[^.]*BF16 gradients"
    )
    offenders = [item.id for item in load_bank().values() if wrong.search(_taught_text(item))]
    assert not offenders, f"these items present BF16 gradient reduction as exact: {offenders}"


def test_busbw_is_not_taught_as_what_the_link_carries():
    offenders = [
        item.id
        for item in load_bank().values()
        if re.search(r"busbw is what the link actually carries", _taught_text(item))
    ]
    assert not offenders, f"busbw is a ring normalisation, not a wire measurement: {offenders}"


def test_nccl_debugging_variables_are_taught_by_one_item():
    holders = [
        item.id
        for item in load_bank().values()
        if sum("NCCL_IB_DISABLE" in c.text for c in item.choices) >= 1
        and sum("NCCL_P2P_DISABLE" in c.text for c in item.choices) >= 1
    ]
    assert len(holders) == 1, f"duplicate NCCL environment-variable items: {holders}"


def test_checkpoint_keys_use_the_12_byte_convention():
    odd = [
        item.id
        for item in load_bank().values()
        if item.kind == "numeric"
        and "checkpoint" in item.key.call
        and item.key.kwargs.get("bytes_per_param", 12) != 12
    ]
    assert not odd, f"checkpoints are 12 B/param everywhere (dtlab.cost.checkpoint_cost): {odd}"


def test_multi_node_items_state_the_nic_topology():
    # every key priced on a multi-node TwoTierCluster says how many NICs a node has
    unstated = [
        item.id
        for item in load_bank().values()
        if item.kind == "numeric"
        and "TwoTierCluster" in repr(item.key)
        and not re.search(r"NIC|rail", item.prompt)
    ]
    assert not unstated, f"state one NIC per GPU (or per node) in the prompt: {unstated}"
