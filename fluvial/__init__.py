"""Fluvial: a Kafka-protocol-compatible table broker storing every topic as Arrow IPC."""
__version__ = "0.1.0"

# In a source checkout this folder holds only the top module; the subpackages (broker,
# protocol, ...) are its sibling folders, mapped by pyproject.toml's package-dir. When the
# checkout itself is on sys.path (pytest run from it puts the root there), Python finds this
# folder first: without the line below a `pip install .` (not -e) elsewhere would be
# shadowed and `fluvial.broker` not found. With it, the checkout's code is what runs.
def _checkout_root():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "broker" / "__init__.py").is_file():
        return str(root)
    return None


if (_root := _checkout_root()) is not None and _root not in __path__:
    __path__.append(_root)
del _root, _checkout_root
