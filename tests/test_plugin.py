"""The UI plugin: loads through Airflow's plugin manager and shows shards from the metadata table."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from helpers import make_sink

ROOT = Path(__file__).resolve().parents[1]


def test_plugin_is_discovered_by_airflow():
    from airflow import plugins_manager

    plugins_manager.ensure_plugins_loaded()
    names = [p.name for p in plugins_manager.plugins or []]
    assert "reconcile" in names


def test_overview_page_shows_frontiers_and_batches(tmp_path, sqlite_store, monkeypatch):
    import importlib.util

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "ui_sink")
    (tmp_path / "broken.yaml").write_text("kind: nope\n")
    sqlite_store.mint(cfg.name, cfg.as_of, "run-1", 1, 5000)
    spec = importlib.util.spec_from_file_location("reconcile_plugin", ROOT / "plugins" / "reconcile_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = TestClient(module.app).get("/")
    assert page.status_code == 200
    assert "ui_sink" in page.text and "minted" in page.text
    assert "broken.yaml" in page.text  # invalid configs are listed, not hidden
