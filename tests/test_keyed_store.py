"""The one keyed-artifact writer and reader (train/core/keyed_store.py): a stored artifact reads
back only under its own key and with its payload whole; anything else reads as missing, so it is
recomputed, and the marker's bytes are those every kind wrote before it was shared."""
import json

import pytest

from counteraudit.train.core.artifacts import atomic_write_json, atomic_write_text, file_sha256
from counteraudit.train.core.keyed_store import KeyedArtifact, as_stored

KIND = KeyedArtifact(payload="table.csv", marker="marker.json", digest_field="table_sha256",
                     what="test table", marker_what="test marker")
KEY = {"method": "gradcam", "layers": ("a", "b"), "steps": 3}


def write_table(text: str):
    return lambda path: atomic_write_text(path, text)


def test_round_trip(tmp_path):
    record = KIND.save(tmp_path, KEY, write_table("x,y\n1,2\n"), {"rows": 1})
    assert KIND.find(tmp_path, KEY) == record
    assert KIND.is_stored(tmp_path, KEY)
    assert (tmp_path / "table.csv").read_text() == "x,y\n1,2\n"
    # the key as JSON holds it: the tuple compares as the list read back
    assert record == {"rows": 1, "key": {"method": "gradcam", "layers": ["a", "b"], "steps": 3},
                      "table_sha256": file_sha256(tmp_path / "table.csv")}


def test_the_marker_is_byte_for_byte_what_the_kinds_wrote_before(tmp_path):
    """Sorted keys, two-space indent, a final newline: atomic_write_json of key, digest, extras."""
    KIND.save(tmp_path / "new", KEY, write_table("payload"), {"count": 2})
    digest = file_sha256(atomic_write_text(tmp_path / "old" / "table.csv", "payload"))
    atomic_write_json(tmp_path / "old" / "marker.json",
                      {"key": as_stored(KEY), "table_sha256": digest, "count": 2})
    assert (tmp_path / "new" / "marker.json").read_bytes() == \
        (tmp_path / "old" / "marker.json").read_bytes()


def test_a_kind_names_its_key_and_digest_fields(tmp_path):
    kind = KeyedArtifact(payload="images.npz", marker="index.json", digest_field="images_sha256",
                         what="image set", marker_what="image set index", key_field="id")
    kind.save(tmp_path, "abc123", write_table("pixels"))
    assert set(json.loads((tmp_path / "index.json").read_text())) == {"id", "images_sha256"}
    assert kind.is_stored(tmp_path, "abc123") and not kind.is_stored(tmp_path, "abc124")


def test_a_changed_key_reads_as_missing_and_keeps_the_artifact(tmp_path):
    KIND.save(tmp_path, KEY, write_table("x"))
    assert KIND.find(tmp_path, {**KEY, "steps": 4}) is None
    assert KIND.find(tmp_path, {k: v for k, v in KEY.items() if k != "steps"}) is None
    assert KIND.is_stored(tmp_path, KEY)  # another key's artifact is left as it is


def test_no_key_asked_reads_any_key(tmp_path):
    """A kind whose folder is named by its key (a model) reads without comparing it."""
    KIND.save(tmp_path, "model-key", write_table("weights"))
    assert KIND.is_stored(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "deleted"])
def test_a_corrupt_payload_reads_as_missing_and_loses_its_marker(tmp_path, capsys, damage):
    KIND.save(tmp_path, KEY, write_table("x,y\n" + "1,2\n" * 100))
    payload = tmp_path / "table.csv"
    if damage == "truncated":
        payload.write_bytes(payload.read_bytes()[:10])
    elif damage == "overwritten":
        payload.write_text("x,y\n" + "1,3\n" * 100)
    else:
        payload.unlink()
    assert not KIND.is_stored(tmp_path, KEY)
    assert not (tmp_path / "marker.json").exists()  # so the next run recomputes it
    if damage != "deleted":  # set aside and named, for a person to look at
        assert (tmp_path / "table.csv.corrupt").is_file()
        assert f"test table {payload} is corrupt" in capsys.readouterr().err
    KIND.save(tmp_path, KEY, write_table("redone"))
    assert KIND.is_stored(tmp_path, KEY)


def test_a_marker_that_is_not_json_reads_as_missing(tmp_path):
    KIND.save(tmp_path, KEY, write_table("x"))
    (tmp_path / "marker.json").write_text("{not json")
    assert not KIND.is_stored(tmp_path, KEY)
    assert KIND.read_marker(tmp_path) is None
    (tmp_path / "marker.json").write_text("[1, 2]")  # JSON, but no marker
    assert not KIND.is_stored(tmp_path, KEY)


def test_the_payload_is_written_while_no_marker_is_there(tmp_path):
    """Marker removed first, payload next, marker last: an old marker never stands beside a new
    payload, and a new marker never beside an unfinished one."""
    KIND.save(tmp_path, KEY, write_table("old"))
    seen = []

    def write(path):
        seen.append((tmp_path / "marker.json").exists())
        return atomic_write_text(path, "new")
    KIND.save(tmp_path, {**KEY, "steps": 4}, write)
    assert seen == [False]
    assert KIND.is_stored(tmp_path, {**KEY, "steps": 4})


def test_a_crash_between_payload_and_marker_leaves_missing(tmp_path):
    KIND.save(tmp_path, KEY, write_table("old"))

    def killed(path):
        atomic_write_text(path, "half of the new")
        raise KeyboardInterrupt  # killed before the marker is written

    with pytest.raises(KeyboardInterrupt):
        KIND.save(tmp_path, KEY, killed)
    assert not KIND.is_stored(tmp_path, KEY)
    assert not KIND.is_stored(tmp_path)


def test_require_marker_names_what_is_missing_and_the_marker(tmp_path):
    with pytest.raises(FileNotFoundError, match="not made yet; run make.py .*marker.json"):
        KIND.require_marker(tmp_path, "the table is not made yet; run make.py")
    KIND.save(tmp_path, KEY, write_table("x"), {"rows": 0})
    assert KIND.require_marker(tmp_path, "unused")["rows"] == 0
