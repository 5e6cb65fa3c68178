"""Every code folder is a declared subpackage of `fluvial`, so `pip install .` ships it."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ["broker", "protocol", "schema", "kv", "tiering", "spark", "client", "fluvial"]


def test_every_package_folder_is_declared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = {v.rstrip("/"): k for k, v in config["package-dir"].items()}
    assert set(config["packages"]) == set(config["package-dir"])
    for top in TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            folder = init.parent.relative_to(ROOT).as_posix()
            assert folder in declared, f"{folder} is not in pyproject.toml's package-dir/packages"
            expected = "fluvial" if folder == "fluvial" else "fluvial." + folder.replace("/", ".")
            assert declared[folder] == expected
