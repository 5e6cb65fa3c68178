"""Build hook for the optional compiled record codec; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fluvial.protocol._records",
            ["protocol/_records.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # Without a compiler the package still installs and falls back to pure Python.
            optional=True,
        )
    ],
)
