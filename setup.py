"""Build hook for the optional compiled codecs; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fluvial.protocol._records",
            ["protocol/_records.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # Without a compiler the package still installs and falls back to pure Python.
            optional=True,
        ),
        Extension(
            "fluvial.protocol._produce",
            ["protocol/_produce.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,  # protocol/produce_request.py decodes every request in Python then
        ),
        Extension(
            "fluvial.schema._avro",
            ["schema/_avro.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,  # the NumPy decoder in schema/avro_binary.py is the fallback
        ),
        Extension(
            "fluvial.kv._kvbatch",
            ["kv/_kvbatch.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,  # kv/batch_io.py falls back to pyarrow and NumPy
        ),
        Extension(
            "fluvial.broker.log._bounds",
            ["broker/log/_bounds.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,  # broker/log/statistics.py reduces NumPy views then
        ),
        Extension(
            "fluvial.broker.log._meta_text",
            ["broker/log/_meta_text.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,  # broker/log/batch_meta.py formats in Python then
        ),
        Extension(
            "fluvial.broker._untracked",
            ["broker/_untracked.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,  # broker/gc_untracked.py leaves the classes as they are then
        ),
        Extension(
            "fluvial.broker._netio",
            ["broker/_netio.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
            optional=True,  # broker/netio.py: without it every listener uses the asyncio path
        ),
    ],
)
