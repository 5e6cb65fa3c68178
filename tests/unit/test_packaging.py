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


def test_the_checkout_imports_without_an_editable_install():
    """pytest puts the checkout's root on sys.path, where the `fluvial/` folder is found before
    any installed copy (`pip install .`): the subpackages must still resolve, to the checkout.
    `python -S` leaves out site-packages and with them an editable install's import hooks."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, sys.argv[1]); import fluvial.broker, fluvial.protocol.errors; "
            "print(fluvial.broker.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True,
                         cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == ROOT / "broker" / "__init__.py"


def test_the_compiled_record_codec_is_in_use_in_ci():
    """.ci/run builds the C record codec (protocol/_records.c) and sets FLUVIAL_CI: there a
    silent fall-back to the pure-Python codec is a failure, not a slowdown."""
    import os

    import pytest

    from fluvial.protocol import records

    if not os.environ.get("FLUVIAL_CI"):
        pytest.skip("outside CI the compiled codec is optional (the broker warns without it)")
    assert records.HAS_NATIVE, f"the compiled record codec did not load: {records.NATIVE_IMPORT_ERROR}"


def test_the_compiled_kv_batch_steps_are_in_use_in_ci():
    """.ci/run builds kv/_kvbatch.c (the KV read path's one-pass steps) too: in CI a silent
    fall-back to the pyarrow/NumPy versions is a failure, not a slowdown."""
    import os

    import pytest

    from fluvial.kv import batch_io

    if not os.environ.get("FLUVIAL_CI"):
        pytest.skip("outside CI the compiled steps are optional (kv/batch_io.py falls back)")
    assert batch_io.USE_NATIVE, "kv/_kvbatch.c was not built"
