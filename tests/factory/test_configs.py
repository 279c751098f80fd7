"""The parsed-config cache: keyed by content, validated on load, never trusted blindly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_trainpipe.factory import configs
from tests.config.test_hostile_configs import HOSTILE_DIR
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.config_work import MAX_EVENTS, counted_work

FRAUD = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(configs.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(configs, "_memory", {})  # each test starts as a fresh DAG-processor process
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "fraud_detector.yaml").write_text(FRAUD)
    return folder


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("*.json"))


def test_a_second_parse_is_served_from_the_cache(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [first] = configs.read_config_folder(folder)
    assert len(_entries(tmp_path)) == 1
    monkeypatch.setattr(configs, "_memory", {})

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed the YAML again although the cache holds it")

    monkeypatch.setattr(configs, "parse_config", no_parse)
    [second] = configs.read_config_folder(folder)
    assert second.config == first.config


def test_changed_content_is_a_new_entry(folder: Path, tmp_path: Path) -> None:
    configs.read_config_folder(folder)
    (folder / "fraud_detector.yaml").write_text(FRAUD.replace("learning_rate: 0.002", "learning_rate: 0.003"))
    [file] = configs.read_config_folder(folder)
    assert file.config.training.hyperparameters.learning_rate == 0.003
    assert len(_entries(tmp_path)) == 2
    # Formatting-only edits are another file content, so another (equally valid) entry.


def test_a_damaged_or_tampered_entry_is_a_miss(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs.read_config_folder(folder)
    [entry] = _entries(tmp_path)
    for damage in ("{not json", entry.read_text().replace('"learning_rate":0.002', '"learning_rate":-5.0')):
        entry.write_text(damage)
        monkeypatch.setattr(configs, "_memory", {})
        [file] = configs.read_config_folder(folder)
        assert file.config.training.hyperparameters.learning_rate == 0.002  # re-parsed from the YAML


def test_broken_configs_are_not_cached_and_name_the_file(folder: Path, tmp_path: Path) -> None:
    (folder / "bad.yaml").write_text(
        FRAUD.replace("pipeline: fraud_detector", "pipeline: bad").replace("epochs: 3", "epochs: -1")
    )
    (folder / ".hidden.yaml").write_text("ignored: true")
    (folder / "notes.txt").write_text("ignored")
    files = configs.read_config_folder(folder, display_root=folder.parent)
    assert [f.name for f in files] == ["configs/bad.yaml", "configs/fraud_detector.yaml"]
    bad = files[0]
    assert (
        bad.config is None
        and "configs/bad.yaml:" in str(bad.error)
        and "training.hyperparameters.epochs" in str(bad.error)
    )
    assert len(_entries(tmp_path)) == 1


def test_cache_off_and_unwritable_cache(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(configs.CACHE_ENV, "off")
    assert configs.read_config_folder(folder)[0].config is not None
    assert not (tmp_path / "cache").exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(configs.CACHE_ENV, str(blocker / "cache"))  # cannot be created: only slower
    monkeypatch.setattr(configs, "_memory", {})
    assert configs.read_config_folder(folder)[0].config is not None


def test_the_cache_key_covers_the_config_rules(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs.read_config_folder(folder)
    monkeypatch.setattr(configs, "_code_fingerprint", lambda: b"other rules")
    monkeypatch.setattr(configs, "_memory", {})
    configs.read_config_folder(folder)
    assert len(_entries(tmp_path)) == 2


def test_an_unreadable_config_names_its_file(folder: Path) -> None:
    (folder / "latin1.yaml").write_bytes("pipeline: caf\xe9\n".encode("latin-1"))
    files = {f.name: f for f in configs.read_config_folder(folder, display_root=folder.parent)}
    bad = files["configs/latin1.yaml"]
    assert bad.config is None and str(bad.error).startswith(
        "configs/latin1.yaml: <document>: cannot read file:"
    )
    assert files["configs/fraud_detector.yaml"].config is not None


@pytest.mark.timeout(30)  # a FIFO read would block forever
def test_entries_that_are_not_config_files_are_reported(folder: Path) -> None:
    (folder / "dir.yaml").mkdir()
    (folder / "loop_a.yaml").symlink_to("loop_b.yaml")
    (folder / "loop_b.yaml").symlink_to("loop_a.yaml")
    (folder / "dangling.yaml").symlink_to("gone.yaml")
    os.mkfifo(folder / "pipe.yaml")
    (folder / "link.yaml").symlink_to("fraud_detector.yaml")  # a symlink to a config is that config
    files = {f.name: f for f in configs.read_config_folder(folder, display_root=folder.parent)}
    assert files["configs/fraud_detector.yaml"].config is not None
    assert files["configs/link.yaml"].config == files["configs/fraud_detector.yaml"].config
    expected = {
        "dir.yaml": "it is a directory, not a config file",
        "loop_a.yaml": "it is a symlink loop",
        "loop_b.yaml": "it is a symlink loop",
        "dangling.yaml": "it is a symlink to 'gone.yaml', which does not exist",
        "pipe.yaml": "it is a named pipe, not a config file",
    }
    for name, what in expected.items():
        assert str(files[f"configs/{name}"].error) == f"configs/{name}: <document>: cannot read file: {what}"


def test_a_hostile_file_is_never_cached_and_costs_no_more_than_its_limits(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "bomb.yaml").write_bytes((HOSTILE_DIR / "billion_laughs.yaml").read_bytes())
    (folder / "cycle.yaml").write_text("pipeline: evil\ntags: &x [*x]\n")
    with open(folder / "huge.yaml", "wb") as handle:
        handle.truncate(40_000_000)  # sparse: nothing to read unless someone reads it
    for _ in range(2):  # the second pass must not find them in any cache
        with counted_work(monkeypatch) as work:
            files = {f.name: f for f in configs.read_config_folder(folder, display_root=folder.parent)}
        # The valid config, and the bomb and the cycle up to their limits; the huge file unread.
        assert work.events <= 3 * MAX_EVENTS
        assert work.bytes_read == sum(
            (folder / name).stat().st_size for name in ("bomb.yaml", "cycle.yaml", "fraud_detector.yaml")
        )
        assert files["configs/fraud_detector.yaml"].config is not None
        assert "over the limit of 10,000" in str(files["configs/bomb.yaml"].error)
        assert "alias *x refers to a node that contains it" in str(files["configs/cycle.yaml"].error)
        assert "file is 40,000,000 bytes" in str(files["configs/huge.yaml"].error)
    assert len(_entries(tmp_path)) == 1 and len(configs._memory) == 1


def test_odd_file_names_are_shown_printable(folder: Path) -> None:
    for raw in (b"new\nline.yaml", b"esc\x1b[31m.yaml", b"caf\xe9.yaml", "caf\u00e9.yaml".encode()):
        Path(os.fsdecode(os.fsencode(folder) + b"/" + raw)).write_bytes(b"pipeline: [\n")
    names = sorted(f.name for f in configs.read_config_folder(folder, display_root=folder.parent))
    assert names == [
        "configs/caf\\xe9.yaml",
        "configs/café.yaml",
        "configs/esc\\x1b[31m.yaml",
        "configs/fraud_detector.yaml",
        "configs/new\\nline.yaml",
    ]
