"""The bind shim (``eray_provider/runtime/bindshim.c``), a plain shared library that
node_run preloads into Ray, built as an optional extension so that pip compiles it: without
a C compiler the package still installs, and Ray listens on all interfaces, as it does by
default, with a warning. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "eray_provider.runtime._bindshim",
            sources=["eray_provider/runtime/bindshim.c"],
            libraries=["dl"],
            optional=True,
        )
    ]
)
