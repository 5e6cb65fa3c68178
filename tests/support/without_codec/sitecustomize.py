"""Put on PYTHONPATH to start a process whose compiled record codec cannot be loaded, as on
a machine without a C compiler: the import of fluvial.protocol._records fails."""
import sys


class _NoCompiledCodec:
    def find_spec(self, name, path=None, target=None):
        if name == "fluvial.protocol._records":
            raise ImportError("fluvial.protocol._records is blocked (no compiled codec on this machine)")
        return None


sys.meta_path.insert(0, _NoCompiledCodec())
