"""Records of results and the leaderboard built from them (evaluate/records, evaluate/record.py,
evaluate/leaderboard.py): the committed records validate and build the committed leaderboard; every
field of the schema refuses a wrong type or range with one error naming the key; a record of an
unknown population, or renamed, is refused; `counteraudit record` on a small finished run with null
models writes the same bytes twice; the page renders at a laptop's and a phone's width."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from counteraudit.evaluate.leaderboard import GUIDE_END, GUIDE_START, guide_block
from counteraudit.evaluate.records.populations import known_populations
from counteraudit.evaluate.records.schema import RecordError, RecordV1, sha256_of
from counteraudit.evaluate.records.store import read_record, read_records, record_id
from counteraudit.evaluate.reporting.leaderboard import (CONTROL, board_table, boards, leaderboard_html,
                                                         leaderboard_markdown)
from tests.conftest import (ONE_PROCESS, REPO, command_in_process, run_in_process, run_script, with_nulls,
                            write_suite)
from tests.test_report import chromium, render

LEADERBOARD = REPO / "evaluate" / "leaderboard"

# The smallest suite with verdicts: 3 references, 2 held-out clean models fitting the null (the
# empirical test needs 1), a backdoor of two replicates, a method and the outputs-only control.
NULLS_BODY = """
held_out = 2

[[anomalies]]
name = "backdoor"
family = "backdoor"
params = { nu = 0.3, size = 0.2 }
replicates = 2

[explain]
methods = ["guided_backprop", "outputs_only"]

[evaluate]
detection_images = 8
localization_images = 4
p_value = "empirical"
"""
EXPORTED_WITH = {"version": "0.1.0", "commit": "the-release-commit"}


# ---------------------------------------------------------------- the committed leaderboard
def test_committed_records_validate_and_build_the_committed_leaderboard():
    """CI's check: every committed record passes the schema, its id and the known populations,
    and LEADERBOARD.md, index.html and the guide's block are byte for byte what they build (with
    no record too)."""
    records = read_records(LEADERBOARD / "records")
    markdown = leaderboard_markdown(records)
    assert (LEADERBOARD / "LEADERBOARD.md").read_text(encoding="utf-8") == markdown, \
        "rebuild: counteraudit leaderboard evaluate/leaderboard/records --markdown ... (evaluate/README.md)"
    assert (LEADERBOARD / "index.html").read_text(encoding="utf-8") == leaderboard_html(records)
    guide = (REPO / "evaluate" / "README.md").read_text(encoding="utf-8")
    assert guide.count(GUIDE_START) == guide.count(GUIDE_END) == 1
    assert guide_block(guide) == markdown


def test_the_known_populations_name_the_replicated_release():
    known = known_populations()
    assert "replicated" in known
    assert len(known["replicated"].population_id) == 64


# ---------------------------------------------------------------- a finished run's records
# NULLS_BODY's suite as an extension of the session's finished run (E2E_BODY: the same 3
# references, methods and image counts): its references and backdoor, and the replicated run's
# first two held-out references, are the models trained once for the whole test run.
RECORDED_BODY = """[references]
held_out = 2
held_out_check = 0
[evaluate]
p_value = "empirical"
[[anomalies]]
name = "backdoor"
family = "backdoor"
params = { nu = 0.3, size = 0.2 }
replicates = 2
"""


@pytest.fixture(scope="session")
def recorded_run(finished_run, replicas_run, tmp_path_factory):
    """(suite file, runs dir, known populations file, records folder) of a finished run of
    RECORDED_BODY (detect, then localize), its population registered as released by
    ``EXPORTED_WITH``, and its records written by `counteraudit record`."""
    from counteraudit.evaluate.pipeline import load_checked_suite  # noqa: PLC0415 (after conftest's numerics)
    from counteraudit.evaluate.release.export import population_id  # noqa: PLC0415
    base = tmp_path_factory.mktemp("records")
    suite, runs = with_nulls(finished_run[0], replicas_run[1], base, "nulls", RECORDED_BODY)
    for script in ("evaluate/detect.py", "evaluate/localize.py"):
        run_in_process(script, "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                       "--no-progress", *ONE_PROCESS)
    released = population_id(load_checked_suite(suite), runs, EXPORTED_WITH)
    known = base / "populations.toml"
    known.write_text(f'[nulls]\npopulation_id = "{released}"\nexported_with = {{ version = '
                     f'"{EXPORTED_WITH["version"]}", commit = "{EXPORTED_WITH["commit"]}" }}\n')
    out = base / "records"
    # in this process; test_a_record_built_twice_... runs the command and compares the bytes
    run_in_process("evaluate/record.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                   "--populations", known, "--out", out, "--no-progress", *ONE_PROCESS)
    return suite, runs, known, out


def test_a_runs_population_id_is_what_its_export_names_it(recorded_run, tmp_path):
    """Computed without writing a release, the id is the exported manifest's SHA-256; with the
    code version a release names, the id of that release (the known populations' rule)."""
    from counteraudit.evaluate.pipeline import load_checked_suite  # noqa: PLC0415 (after conftest's numerics)
    from counteraudit.evaluate.release.export import export_population, population_id  # noqa: PLC0415
    suite_path, runs, known, _ = recorded_run
    suite = load_checked_suite(suite_path)
    _, exported, manifest = export_population(suite, tmp_path / "release", runs)
    assert population_id(suite, runs) == exported
    assert population_id(suite, runs, EXPORTED_WITH) == known_populations(known)["nulls"].population_id
    assert (manifest.counteraudit == EXPORTED_WITH) == (exported == population_id(suite, runs, EXPORTED_WITH))


def test_record_writes_one_valid_record_per_method(recorded_run):
    suite, _, known, out = recorded_run
    records = read_records(out, known_path=known)
    assert sorted(r.method.name for r in records) == ["guided_backprop", "outputs_only"]
    for record in records:
        assert record.population.suite == "nulls"
        assert record.population.population_id == known_populations(known)["nulls"].population_id
        assert [f.family for f in record.families] == ["backdoor"]
        assert record.families[0].n_models == 2
        assert [c.configuration for c in record.localization] == ["backdoor"]
        assert record.cost.images > 0 and record.cost.timed_results > 0
        assert record.verdicts.test == "empirical" and record.population.n_null_fit == 2
    method = next(r for r in records if r.method.name == "guided_backprop")
    assert {(c.against, c.family) for c in method.comparisons} == {("outputs_only", "backdoor")}
    control = next(r for r in records if r.method.name == "outputs_only")
    assert control.comparisons == []  # no other control in the run


def test_a_record_built_twice_from_the_same_run_is_byte_identical(recorded_run, tmp_path):
    suite, runs, known, out = recorded_run
    again = tmp_path / "again"
    run_script("evaluate/record.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
               "--populations", known, "--out", again, "--no-progress", *ONE_PROCESS)
    first = {p.name: p.read_bytes() for p in out.glob("*.json")}
    assert first and first == {p.name: p.read_bytes() for p in again.glob("*.json")}


def test_a_records_verdicts_do_not_depend_on_the_methods_run_beside_it(recorded_run, tmp_path):
    """--method guided_backprop --no-control: the same family verdicts and localization as in the
    run of both methods (no control, so no comparison)."""
    suite, runs, known, out = recorded_run
    alone = tmp_path / "alone"
    run_in_process("evaluate/record.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                   "--populations", known, "--out", alone, "--method", "guided_backprop",
                   "--no-control", "--no-progress", *ONE_PROCESS)
    (single,) = read_records(alone, known_path=known)
    both = next(r for r in read_records(out, known_path=known)
                if r.method.name == "guided_backprop")
    assert single.families == both.families and single.localization == both.localization
    assert single.comparisons == []


def refusal(suite: Path, folder: Path) -> str:
    """`counteraudit record`'s error on ``suite`` with an empty runs folder, once it checked that
    nothing was trained or written."""
    result = command_in_process("evaluate/record.py", "--suite", suite, "--runs-dir", folder / "runs",
                                "--out", folder / "records")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert not (folder / "records").exists() and not (folder / "runs" / suite.stem).exists()
    return result.stderr


def test_a_detection_only_record_says_table_2_was_not_run_and_keeps_the_verdicts(recorded_run,
                                                                                  tmp_path):
    """--detection-only reads detect's tables alone: the same families, verdicts and control
    comparisons as the full record, and each localizable configuration says it was not run
    instead of holding an AUROC."""
    from counteraudit.evaluate.records.build import NOT_RUN_REASON  # noqa: PLC0415 (after conftest's numerics)
    suite, runs, known, out = recorded_run
    detection_only = tmp_path / "detection-only"
    run_in_process("evaluate/record.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                   "--populations", known, "--out", detection_only, "--detection-only", "--no-progress",
                   *ONE_PROCESS)
    full = {r.method.name: r for r in read_records(out, known_path=known)}
    partial = {r.method.name: r for r in read_records(detection_only, known_path=known)}
    assert set(partial) == set(full)
    for name, record in partial.items():
        assert record.families == full[name].families
        assert record.comparisons == full[name].comparisons
        assert [c.configuration for c in record.localization] == ["backdoor"]
        assert all(c.reason == NOT_RUN_REASON and c.mean_auroc is None
                   for c in record.localization)
        assert record_id(record) != record_id(full[name])


def test_record_refuses_a_suite_without_null_models_before_any_work(tmp_path):
    said = refusal(write_suite(tmp_path / "plain.toml",
                               body="[explain]\nmethods = [\"outputs_only\"]\n"), tmp_path)
    assert "[references] held_out" in said and "[evaluate] p_value" in said


def test_record_refuses_an_unfinished_run_before_any_work(tmp_path):
    said = refusal(write_suite(tmp_path / "unfinished.toml", body=NULLS_BODY), tmp_path)
    assert "is not finished" in said and "counteraudit detect" in said


# ---------------------------------------------------------------- the schema, field by field
def valid_data(recorded_run) -> dict:
    _, _, known, out = recorded_run
    record = next(r for r in read_records(out, known_path=known)
                  if r.method.name == "guided_backprop")
    return record.data()


def _resolve(schema: dict, defs: dict) -> dict:
    """A property's JSON schema with $ref followed and a nullable anyOf reduced to its non-null
    member."""
    if "$ref" in schema:
        return _resolve(defs[schema["$ref"].split("/")[-1]], defs)
    members = [m for m in schema.get("anyOf", []) if m.get("type") != "null"]
    return _resolve(members[0], defs) if len(members) == 1 else schema


WRONG_TYPE = {"string": 7, "integer": "7", "number": "0.5", "boolean": "yes", "array": "x",
              "object": "x"}


def _out_of_range(schema: dict) -> list:
    """Values just outside each of the property's constraints."""
    values = []
    if "minimum" in schema:
        values.append(schema["minimum"] - (1 if schema.get("type") == "integer" else 0.5))
    if "exclusiveMinimum" in schema:
        values.append(schema["exclusiveMinimum"])
    if "maximum" in schema:
        values.append(schema["maximum"] + (1 if schema.get("type") == "integer" else 0.5))
    if "exclusiveMaximum" in schema:
        values.append(schema["exclusiveMaximum"])
    if "pattern" in schema:
        values.append("NOT-HEX")
    if "minLength" in schema:
        values.append("")
    if "maxLength" in schema:
        values.append("a" * (schema["maxLength"] + 1))
    if "enum" in schema or "const" in schema:
        values.append("not one of the words")
    return values


def schema_cases(data, schema: dict, defs: dict, path: tuple = ()):
    """(key path, bad value, what) for every field of the record's JSON schema present in
    ``data``: a value of the wrong type, and one outside each of its ranges (a list's first item
    stands for all)."""
    schema = _resolve(schema, defs)
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key in data:
                yield from schema_cases(data[key], sub, defs, (*path, key))
        return
    if kind == "array" and data:
        yield (path, WRONG_TYPE["array"], "wrong type")
        yield from schema_cases(data[0], schema.get("items", {}), defs, (*path, 0))
        return
    wrong = WRONG_TYPE.get(kind, [] if "const" in schema or "enum" in schema else None)
    if wrong is not None:
        yield (path, wrong, "wrong type")
    for value in _out_of_range(schema):
        yield (path, value, "out of range")


def _with(data: dict, path: tuple, value) -> dict:
    changed = copy.deepcopy(data)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


def test_every_field_refuses_a_wrong_type_or_range_naming_its_key(recorded_run, tmp_path):
    data = valid_data(recorded_run)
    schema = RecordV1.model_json_schema(by_alias=True)
    cases = list(schema_cases(data, schema, schema.get("$defs", {})))
    keys = {path for path, _, _ in cases}
    # every field the record holds is exercised (parameters are the method's own: any JSON)
    assert {("method", "name"), ("population", "population_id"), ("families", 0, "rate"),
            ("families", 0, "verdict"), ("localization", 0, "chance_high"), ("schema",),
            ("comparisons", 0, "p_holm"), ("cost", "cpu_seconds"), ("verdicts", "alpha")} <= keys
    assert len(cases) > 60
    _, _, known, _ = recorded_run
    for path, value, what in cases:
        file = tmp_path / "bad.json"
        file.write_text(json.dumps(_with(data, path, value)))
        with pytest.raises(RecordError) as raised:
            read_record(file, known_path=known)
        message = str(raised.value)
        key = ".".join(map(str, path))
        assert message.startswith(f"{file}: "), (path, what, message)
        assert f"{key}:" in message or f"{key} =" in message, (path, value, what, message)


@pytest.mark.parametrize("change, said", [
    (lambda d: d["families"][0].update(n_detected=d["families"][0]["n_models"] + 1),
     "must equal n_models"),
    (lambda d: d["families"][0].update(rate=1.0, ci_high=0.5), "must hold the value"),
    (lambda d: d["localization"][0].update(mean_auroc=None), "must all be given"),
    (lambda d: d["method"].update(parameters={"steps": 3}), "parameters_sha256"),
    (lambda d: d.update(distance="manhattan"), "not a registered distance"),
    (lambda d: d["verdicts"].update(test="coin"), "not a registered null test"),
    (lambda d: d.update(unknown_key=1), "unknown_key"),
    (lambda d: d.update(schema="counteraudit.record/99"), "not a record schema"),
])
def test_a_record_that_contradicts_itself_is_refused(recorded_run, tmp_path, change, said):
    data = valid_data(recorded_run)
    change(data)
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=said):
        read_record(file, known_path=recorded_run[2])


def test_a_record_of_an_unknown_population_is_refused(recorded_run, tmp_path):
    data = valid_data(recorded_run)
    data["population"]["population_id"] = sha256_of("another population")
    record = RecordV1.model_validate(data)
    file = tmp_path / f"{record_id(record)}.json"
    file.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="matches no known population"):
        read_record(file, known_path=recorded_run[2])
    with pytest.raises(RecordError, match="suite 'nulls' has no known population"):
        read_record(file)  # the committed known populations: only released ones


def test_a_renamed_record_is_refused(recorded_run, tmp_path):
    _, _, known, out = recorded_run
    original = sorted(out.glob("*.json"))[0]
    renamed = tmp_path / f"{'0' * 64}.json"
    shutil.copy(original, renamed)
    with pytest.raises(RecordError, match="the file name must be the record's id"):
        read_record(renamed, known_path=known)
    assert read_record(original, known_path=known)  # the same bytes under their own name


# ---------------------------------------------------------------- the leaderboard
def test_the_leaderboard_ranks_methods_and_shows_the_controls_unranked(recorded_run, tmp_path):
    _, _, known, out = recorded_run
    records = read_records(out, known_path=known)
    (board,) = boards(records)
    table = board_table(board).set_index("method")
    assert table.loc["guided_backprop", "rank"] == "1"
    assert table.loc["outputs_only", "rank"] == CONTROL
    cell = table.loc["guided_backprop", "backdoor"]
    family = next(r for r in records if r.method.name == "guided_backprop").families[0]
    assert cell.startswith(f"{family.rate:.2f} [{family.ci_low:.2f}, {family.ci_high:.2f}] "
                           f"{family.verdict}")
    # another population's record: a table of its own, never mixed in
    data = records[0].data()
    data["population"]["population_id"] = sha256_of("elsewhere")
    assert len(boards([*records, RecordV1.model_validate(data)])) == 2


def test_tied_methods_share_a_rank(recorded_run):
    _, _, known, out = recorded_run
    method = next(r for r in read_records(out, known_path=known)
                  if r.method.name == "guided_backprop")
    twin = RecordV1.model_validate({**method.data(), "method": {
        **method.data()["method"], "name": "integrated_gradients"}})
    (board,) = boards([method, twin])
    assert list(board_table(board)["rank"]) == ["1", "1"]


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.sources = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.sources += [value for name, value in attrs if name in ("src", "href")]


def test_the_page_is_self_contained_and_escapes_what_a_record_says(recorded_run, tmp_path):
    _, _, known, out = recorded_run
    data = valid_data(recorded_run)
    data["hardware"]["cpu"] = "<script>alert(1)</script> **bold** [x](http://evil)"
    hostile = RecordV1.model_validate(data)
    page = leaderboard_html([hostile])
    parser = _Tags()
    parser.feed(page)
    assert "script" not in parser.tags and not parser.sources
    assert "&lt;script&gt;" in page
    markdown = leaderboard_markdown([hostile])
    assert "<script>" not in markdown and r"\*\*bold\*\*" in markdown and r"[x\](" in markdown


# Two screens a reader opens the page on: a laptop's and a phone's (CSS pixels).
SCREENS = {"laptop": (1366, 768), "phone": (390, 844)}


@pytest.mark.browser
def test_the_page_renders_at_a_laptop_and_a_phone_width_without_overflowing(recorded_run, tmp_path):
    """Each screen an iframe of its size; the page is wider than its screen nowhere (a wide table
    scrolls inside its own box)."""
    _, _, known, out = recorded_run
    records = read_records(out, known_path=known)
    page = tmp_path / "index.html"
    page.write_text(leaderboard_html(records))
    frames = "".join(f'<iframe id="{name}" src="{page.resolve().as_uri()}" width="{w}" '
                     f'height="{h}"></iframe>' for name, (w, h) in SCREENS.items())
    wrapper = tmp_path / "screens.html"
    wrapper.write_text(
        f"<!DOCTYPE html><html><body>{frames}<script>"
        "window.addEventListener('load', function () {"
        " document.querySelectorAll('iframe').forEach(function (frame) {"
        "  var root = frame.contentDocument.documentElement;"
        "  document.body.setAttribute('data-' + frame.id,"
        "   root.scrollWidth + 'x' + root.clientWidth + 'x'"
        "   + frame.contentDocument.querySelectorAll('table').length); }); });"
        "</script></body></html>")
    attributes, _, console = render(wrapper, tmp_path / "profile", "--allow-file-access-from-files")
    assert not console, console
    for name, (width, _) in SCREENS.items():
        scroll, client, tables = map(int, attributes[f"data-{name}"].split("x"))
        assert tables == 1 and client <= width and scroll <= client, (name, attributes)
    shot = tmp_path / "phone.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=390,844",
                    f"--screenshot={shot}", page.resolve().as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 0


def test_leaderboard_command_refuses_a_bad_record_naming_file_and_key(recorded_run, tmp_path):
    data = valid_data(recorded_run)
    data["families"][0]["rate"] = 1.5
    folder = tmp_path / "records"
    folder.mkdir()
    bad = folder / f"{'1' * 64}.json"
    bad.write_text(json.dumps(data))
    result = command_in_process("evaluate/leaderboard.py", folder, "--populations", recorded_run[2],
                                "--markdown", tmp_path / "LB.md")
    assert result.returncode == 2
    assert str(bad) in result.stderr and "families.0.rate" in result.stderr
    assert not (tmp_path / "LB.md").exists()


def test_leaderboard_command_writes_the_guides_block(recorded_run, tmp_path):
    _, _, known, out = recorded_run
    guide = tmp_path / "guide.md"
    guide.write_text(f"# Guide\n\nbefore\n\n{GUIDE_START}\nold\n{GUIDE_END}\n\nafter\n")
    run_in_process("evaluate/leaderboard.py", out, "--populations", known, "--guide", guide,
                   "--markdown", tmp_path / "LB.md")
    text = guide.read_text()
    assert guide_block(text) == (tmp_path / "LB.md").read_text()
    assert text.startswith("# Guide\n\nbefore\n\n") and text.endswith(f"{GUIDE_END}\n\nafter\n")


def test_records_outside_a_folder_are_one_clear_error(tmp_path):
    with pytest.raises(RecordError, match="no such folder of records"):
        read_records(tmp_path / "missing")


def test_the_leaderboard_of_no_record_says_so():
    assert "No records yet" in leaderboard_markdown([])
    assert "No records yet" in leaderboard_html([])


def test_the_schema_fields_are_all_documented_in_the_guide():
    guide = (REPO / "evaluate" / "README.md").read_text()
    section = guide.split("## Records and the leaderboard", 1)[1]
    for field in RecordV1.model_json_schema(by_alias=True)["properties"]:
        assert f"`{field}`" in section or field == "schema", field

