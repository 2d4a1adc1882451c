"""Golden tests for the reasoning tasks: frozen completions in, expected scores out.

GPQA rows here are invented (same columns as the real CSV); no GPQA content may ever be committed.
LiveCodeBench data is read from ../shared/data when present (it must not be copied into the repo).
"""

from __future__ import annotations

import base64
import csv
import json
import pickle
import zlib
from pathlib import Path

import pytest

from fp8eval.scoring.code import decode_tests, extract_code
from fp8eval.scoring.math import aime_integer, boxed_answers, last_boxed, score_aime, score_math
from fp8eval.scoring.mcq import choice_order, correct_letter, extract_letter, score_mcq
from fp8eval.tasks import task_class
from fp8eval.tasks.base import TaskContext

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
CTX = TaskContext(count_tokens=lambda p: 0, max_model_len=8192, model_name="test", seed=1234)


def make(name: str, **cfg):
    cls = task_class(name)
    return cls(cls.config_class(**cfg), CTX)


# ------------------------------------------------------------------------------------ boxed extraction
@pytest.mark.parametrize("text, expected", [
    (r"so the answer is $\boxed{42}$.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{x^{2}+\sqrt{\frac{a}{b}}}", r"x^{2}+\sqrt{\frac{a}{b}}"),  # nested braces
    (r"first \boxed{1} then \boxed{2}", "2"),  # the last one wins
    (r"\boxed 5", "5"),
    (r"$\boxed 5$.", "5"),
    (r"\fbox{7}", "7"),
    (r"\boxed{ 12 }", "12"),
    (r"\boxed{3} and then cut off \boxed{4", "3"),  # an unclosed box is not an answer
    ("no box here: 42", None),
    (r"\boxedsomething{3}", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_boxed_answers_order():
    assert boxed_answers(r"\boxed{a} x \fbox{b} \boxed c") == ["a", "b", "c"]


# ------------------------------------------------------------------------------------ AIME
@pytest.mark.parametrize("completion, gold, score", [
    (r"Therefore, the final answer is: $\boxed{70}$. I hope it is correct", 70, 1.0),
    (r"\boxed{070}", 70, 1.0),
    (r"\boxed{25}", "025", 1.0),  # aime24 golds are zero-padded strings
    (r"\boxed{\text{70}}", 70, 1.0),
    (r"\boxed{70^\circ}", 70, 1.0),
    (r"\boxed{1,000}", 0, 0.0),
    (r"\boxed{70.0}", 70, 1.0),  # not an integer literal: the math-verify fallback decides
    (r"\boxed{\frac{140}{2}}", 70, 1.0),
    (r"\boxed{71}", 70, 0.0),
    ("The answer is 70.", 70, 0.0),  # no box, no credit
    (r"\boxed{68} wait, no: \boxed{70}", 70, 1.0),
    (r"\boxed{70} hmm, actually \boxed{68}", 70, 0.0),
])
def test_aime_golden(completion, gold, score):
    assert score_aime(completion, gold).value == score


def test_aime_integer_range():
    assert aime_integer("999") == 999
    assert aime_integer("1000") is None
    assert aime_integer("-5") is None
    assert aime_integer("$0$") == 0


# ------------------------------------------------------------------------------------ MATH-500
@pytest.mark.parametrize("pred, gold, score", [
    (r"\left( 3, \frac{\pi}{2} \right)", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"(3,\pi/2)", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"(3, \pi)", r"\left( 3, \frac{\pi}{2} \right)", 0.0),
    (r"\frac{2}{4}", r"\frac12", 1.0),  # equivalent fractions
    (r"\dfrac{1}{2}", r"\frac{1}{2}", 1.0),
    ("0.5", r"\frac{1}{2}", 1.0),
    (r"\frac{3}{4}", r"\frac{1}{2}", 0.0),
    (r"2\sqrt{2}", r"\sqrt{8}", 1.0),
    ("x = 5", "5", 1.0),
    (r"\text{(C)}", r"\text{(C)}", 1.0),
    (r"10\%", "10", 1.0),
    ("12", "13", 0.0),
])
def test_math500_golden(pred, gold, score):
    got = score_math(rf"Therefore, the final answer is: $\boxed{{{pred}}}$. I hope it is correct", gold)
    assert got.value == score, got


def test_math500_no_box_scores_zero():
    assert score_math("The answer is 5", "5").value == 0.0


def test_math500_task_groups_and_prompt():
    task = make("math500", data_files=["tasks/math500/test.jsonl"])
    samples = task.samples()
    assert len(samples) == 500 and len({s.id for s in samples}) == 500
    first = samples[0]
    assert first.id == "test/precalculus/807.json"
    assert first.groups == ("subject=Precalculus", "level=2")
    text = task.prompt(first, 0).messages[0]["content"]
    assert first.data["problem"] in text and r"$\boxed{ANSWER}$" in text
    assert task.prompt(first, 0) == task.prompt(first, 3)  # one request serves every repeat
    assert task.score(first, r"\boxed{(3,\frac{\pi}{2})}").value == 1.0
    subjects = {g for s in samples for g in s.groups if g.startswith("subject=")}
    assert len(subjects) == 7


def test_aime_tasks_load_offline_defaults():
    t25 = make("aime25", data_files=["tasks/aime25/aime2025_clean.jsonl"])
    s25 = t25.samples()
    assert [s.id for s in s25[:2]] == ["2025-I-1", "2025-I-2"] and len(s25) == 30
    assert t25.score(s25[0], r"\boxed{70}").value == 1.0
    t24 = make("aime24", data_files=["tasks/aime24/aime2024.jsonl"])
    s24 = t24.samples()
    assert len(s24) == 30 and s24[0].data["answer"] == 204
    assert t24.cfg.repeats == 10 and make("math500").cfg.repeats == 5
    assert "templates" in t25.fingerprint() and t25.fingerprint()["data_files"]


def test_pooled_aime_reads_every_year_it_is_given(tmp_path):
    """task=aime (issue 36): the repo's 2024 and 2025 copies pool to 60 problems with year groups and
    `<year>-<I|II>-<n>` ids; rows of other years (an AoPS url, as AI-MO/aimo-validation-aime's) join them,
    `task.years` filters, and a row with no readable year is refused."""
    shipped = ["tasks/aime24/aime2024.jsonl", "tasks/aime25/aime2025_clean.jsonl"]
    if not all((REPO / f).exists() for f in shipped):
        pytest.skip("the repo's AIME 2024/2025 copies are absent")
    s = make("aime", data_files=shipped).samples()
    assert len(s) == 60 and len({x.id for x in s}) == 60
    assert {x.groups for x in s} == {("year=2024",), ("year=2025",)}
    assert "2025-I-1" in {x.id for x in s} and "2024-I-1" in {x.id for x in s}
    extra = tmp_path / "aime2022.jsonl"
    extra.write_text(json.dumps({"problem": "An invented stand-in problem.", "answer": "7",
                                 "url": "https://artofproblemsolving.com/wiki/index.php/2022_AIME_II_Problems/Problem_3"})
                     + "\n", encoding="utf-8")
    s = make("aime", data_files=[*shipped, str(extra)]).samples()
    assert len(s) == 61 and s[-1].id == "2022-II-3" and s[-1].groups == ("year=2022",) and s[-1].data["answer"] == 7
    assert len(make("aime", data_files=[*shipped, str(extra)], years=[2022]).samples()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "p", "answer": 1}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no year, contest and number"):
        make("aime", data_files=[str(bad)]).samples()
    assert make("aime").cfg.repeats == 8 and make("aime").cfg.data_files is None  # the hub's 120 by default


def test_hub_error_says_what_to_pass():
    task = make("aime25")  # no data_files: hub, unreachable here
    with pytest.raises(Exception, match=r"task\.data_files"):
        task.samples()


# ------------------------------------------------------------------------------------ GPQA
@pytest.mark.parametrize("text, letter", [
    ("Answer: C", "C"),
    ("**Answer:** (C)", "C"),
    ("The answer is C.", "C"),
    (r"so $\boxed{C}$", "C"),
    (r"\boxed{\text{C}}", "C"),
    ("ANSWER: **A**", "A"),
    ("Answer: B\nWait, that is wrong.\nAnswer: D", "D"),  # last occurrence wins
    ("A is tempting and B fails, so the answer is (C)", "C"),
    ("Final Answer: [D]", "D"),
    ("The correct option is (B)", "B"),
    ("(B).", "B"),
    ("The answer is Actually unclear", None),
    ("I cannot decide.", None),
])
def test_gpqa_letter_formats(text, letter):
    assert extract_letter(text) == letter


INVENTED_GPQA = [
    {"Question": "A fictional crystal of zorbium emits which colour when heated?", "Correct Answer": "Teal",
     "Incorrect Answer 1": "Mauve", "Incorrect Answer 2": "Ochre", "Incorrect Answer 3": "Puce",
     "Explanation": "Invented for tests.", "Subdomain": "Invented Chemistry", "High-level domain": "Chemistry",
     "Record ID": "recTEST0001", "Canary String": "invented-fixture"},
    {"Question": "In the invented Flib model, how many quarks does a flibon hold?", "Correct Answer": "Seven",
     "Incorrect Answer 1": "Two", "Incorrect Answer 2": "Three", "Incorrect Answer 3": "Eleven",
     "Explanation": "Invented for tests.", "Subdomain": "Invented Physics", "High-level domain": "Physics",
     "Record ID": "recTEST0002", "Canary String": "invented-fixture"},
]


@pytest.fixture
def gpqa_csv(tmp_path):
    path = tmp_path / "gpqa_invented.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(INVENTED_GPQA[0]))
        w.writeheader()
        w.writerows(INVENTED_GPQA)
    return str(path)


def test_gpqa_task_order_prompt_and_score(gpqa_csv):
    task = make("gpqa_diamond", data_files=[gpqa_csv])
    assert type(task).prompt_varies_by_repeat is True and task.cfg.repeats == 5
    samples = task.samples()
    assert [s.groups for s in samples] == [("domain=Chemistry",), ("domain=Physics",)]
    s = samples[0]
    orders = [choice_order(s.id, r, CTX.seed) for r in range(8)]
    assert len({tuple(o) for o in orders}) > 1  # the order changes between repeats
    assert choice_order(s.id, 3, CTX.seed) == choice_order(s.id, 3, CTX.seed)  # and is a pure function
    for r in range(8):
        gold = correct_letter(orders[r])
        text = task.prompt(s, r).messages[0]["content"]
        assert f"{gold}) Teal" in text and s.data["question"] in text
        wrong = next(x for x in "ABCD" if x != gold)
        assert task.score(s, f"Reasoning...\n**Answer:** ({gold})", repeat=r).value == 1.0
        assert task.score(s, f"Answer: {wrong}", repeat=r).value == 0.0
        assert task.score(s, rf"\boxed{{{gold}}}", repeat=r).extracted == gold
    with pytest.raises(TypeError, match="repeat"):
        task.score(s, "Answer: A")


def test_gpqa_choice_order_is_independent_of_the_arm():
    # Both arms build their tasks separately: same (id, repeat, seed) gives the same order.
    a = make("gpqa_diamond").__class__._order
    t1, t2 = make("gpqa_diamond"), make("gpqa_diamond")
    from fp8eval.tasks.base import Sample

    s = Sample(id="recX", data={"question": "q", "options": ["a", "b", "c", "d"]})
    assert all(a(t1, s, r) == a(t2, s, r) for r in range(5))
    assert score_mcq("Answer: B", "B").value == 1.0


# ------------------------------------------------------------------------------------ LiveCodeBench
STDIN_OK = "Here is my solution.\n```python\nn = int(input())\nprint(n * 2)\n```\n"
STDIN_WRONG = "```python\nn = int(input())\nprint(n + 2)\n```"
STDIN_SLOW = "```python\nwhile True:\n    pass\n```"
FUNC_OK = "```python\nclass Solution:\n    def addUp(self, nums: List[int], k: int) -> int:\n        return sum(nums) + k\n```"
FUNC_WRONG = FUNC_OK.replace("sum(nums) + k", "sum(nums) - k")
FUNC_SLOW = FUNC_OK.replace("return sum(nums) + k", "while True: pass")


def _compress(tests: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def _lcb_rows():
    stdin_public = [{"input": "3\n", "output": "6\n", "testtype": "stdin"}]
    stdin_private = [{"input": "21\n", "output": "42\n", "testtype": "stdin"}]
    func_public = [{"input": "[1, 2, 3]\n4", "output": "10", "testtype": "functional"}]
    base = {"question_content": "Invented problem.", "contest_id": "x", "public_test_cases": "",
            "private_test_cases": "", "metadata": "{}", "starter_code": ""}
    return [
        dict(base, question_title="double", platform="atcoder", question_id="inv_a", difficulty="easy",
             contest_date="2025-03-01T00:00:00", public_test_cases=json.dumps(stdin_public),
             private_test_cases=_compress(stdin_private)),
        dict(base, question_title="add-up", platform="leetcode", question_id="9001", difficulty="medium",
             contest_date="2025-04-01T00:00:00", public_test_cases=json.dumps(func_public),
             metadata=json.dumps({"func_name": "addUp"}),
             starter_code="class Solution:\n    def addUp(self, nums: List[int], k: int) -> int:\n        "),
        dict(base, question_title="too-old", platform="atcoder", question_id="inv_old", difficulty="hard",
             contest_date="2024-12-01T00:00:00", public_test_cases=json.dumps(stdin_public)),
    ]


@pytest.fixture
def lcb_jsonl(tmp_path):
    path = tmp_path / "lcb_invented.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _lcb_rows()))
    return str(path)


def test_extract_code_last_fenced_block():
    assert extract_code("```python\na=1\n```\ntext\n```\nb=2\n```") == "b=2"
    # a cut-off last block: officially the lines between the last two fence lines (here none)
    assert extract_code("```python\na=1\n```\n```python\nb=2") == ""
    assert extract_code("no code") is None
    assert extract_code("```py\nx\n```") == "x"


def test_decode_private_tests():
    tests = [{"input": "1", "output": "2", "testtype": "stdin"}]
    assert decode_tests(_compress(tests)) == tests
    assert decode_tests(json.dumps(tests)) == tests
    assert decode_tests("") == [] and decode_tests(None) == []
    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/")))).decode()
    with pytest.raises(pickle.UnpicklingError):
        decode_tests(evil)


def test_livecodebench_task_golden(lcb_jsonl):
    task = make("livecodebench", data_files=[lcb_jsonl], timeout_s=1.0)
    samples = {s.id: s for s in task.samples()}
    assert sorted(samples) == ["9001", "inv_a"]  # the 2024 problem is outside the default window
    stdin, func = samples["inv_a"], samples["9001"]
    assert stdin.data["testtype"] == "stdin" and len(stdin.data["tests"]) == 2  # public + decoded private
    assert func.data["testtype"] == "functional" and func.data["func_name"] == "addUp"
    assert stdin.groups == ("difficulty=easy", "platform=atcoder")
    assert any("public tests only" in n for n in task.notes())  # the functional row has no private tests
    p = task.prompt(func, 0)
    assert p.messages[0]["role"] == "system" and "class Solution" in p.messages[1]["content"]
    assert "# YOUR CODE HERE" in task.prompt(stdin, 0).messages[1]["content"]
    assert task.score(stdin, STDIN_OK).value == 1.0
    assert task.score(stdin, STDIN_WRONG).value == 0.0
    slow = task.score(stdin, STDIN_SLOW)
    assert slow.value == 0.0 and slow.details["first_failure"]["status"] == "timeout"
    assert task.score(func, FUNC_OK).value == 1.0
    assert task.score(func, FUNC_WRONG).value == 0.0
    assert task.score(func, FUNC_SLOW).details["first_failure"]["status"] == "timeout"
    assert task.score(func, "I don't know.").details["status"] == "no_code_block"


def test_livecodebench_public_only_note(lcb_jsonl, tmp_path):
    rows = [dict(r, private_test_cases="") for r in _lcb_rows()]
    path = tmp_path / "public_only.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make("livecodebench", data_files=[str(path)])
    task.samples()
    assert any("public tests only" in n for n in task.notes())


@pytest.mark.skipif(not (SHARED / "livecodebench").is_dir(), reason="../shared/data/livecodebench absent")
def test_livecodebench_shared_v6_window():
    task = make("livecodebench", data_files=[str(SHARED / "livecodebench" / "problems_v5_v6_public_tests.jsonl")])
    samples = task.samples()
    assert len(samples) == 131  # the v6 window [2025-02-01, 2025-05-01) as in its PROVENANCE.md
    platforms = [g for s in samples for g in s.groups if g.startswith("platform=")]
    assert platforms.count("platform=atcoder") == 82 and platforms.count("platform=leetcode") == 49
    assert all((s.data["testtype"] == "functional") == bool(s.data["func_name"]) for s in samples)
    assert any("public tests only" in n for n in task.notes())
    func = next(s for s in samples if s.data["testtype"] == "functional")
    assert task.score(func, "```python\nclass Solution:\n    pass\n```").value == 0.0


# ------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("name", ["aime25", "aime24", "aime", "math500", "gpqa_diamond", "livecodebench"])
def test_task_yaml_matches_its_schema(name):
    from omegaconf import OmegaConf

    raw = OmegaConf.load(REPO / "conf" / "task" / f"{name}.yaml")
    assert list(raw.defaults) == [f"/schema/task/{name}@_here_", "_self_"]
    body = {k: v for k, v in OmegaConf.to_container(raw).items() if k != "defaults"}
    cfg = OmegaConf.merge(OmegaConf.structured(task_class(name).config_class), body)
    assert cfg.name == name
    with pytest.raises(Exception, match="no_such_key"):
        OmegaConf.merge(OmegaConf.structured(task_class(name).config_class), {"no_such_key": 1})


def test_reasoning_suite_lists_the_four_tasks():
    from omegaconf import OmegaConf

    suite = OmegaConf.load(REPO / "conf" / "suite" / "reasoning.yaml")
    assert list(suite.tasks) == ["aime25", "gpqa_diamond", "math500", "livecodebench"]
    assert all(t in __import__("fp8eval.tasks", fromlist=["REGISTRY"]).REGISTRY for t in suite.tasks)


def test_render_leaves_latex_braces_alone():
    from fp8eval.tasks.reasoning_data import render

    assert render("Q: {problem} {unknown}", problem=r"$\frac{a}{b}$ {problem}") == r"Q: $\frac{a}{b}$ {problem} {unknown}"
