"""Build the fastload_c extensions.

Every ``fastload_c/<name>.pyx`` becomes the extension ``fastload_c.<name>``; a
module names its own C sources with a ``# distutils: sources = ...`` line at
its top, so adding a module never touches this file.

Build variants, chosen by environment variable:
  FASTLOAD_DEBUG=1     -O0 -g, C assertions on, Cython bounds checks on.
  FASTLOAD_SANITIZE=1  as DEBUG, plus AddressSanitizer and UBSan (run with
                       LD_PRELOAD of libasan, as for any sanitized extension).
Cython writes the C of these variants under build/, not beside the .pyx, so
that a variant never reuses C generated with another's directives.
.ci/sanitized builds the sanitized variant and runs part of the suite on it.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

debug = os.environ.get("FASTLOAD_DEBUG") == "1"
sanitize = os.environ.get("FASTLOAD_SANITIZE") == "1"
debug = debug or sanitize

compile_args = ["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
link_args = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if debug:
    compile_args += ["-O0", "-g", "-UNDEBUG"]
else:
    compile_args += ["-O3"]
    macros.append(("NDEBUG", "1"))
if sanitize:
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    compile_args += flags
    link_args += flags

directives = {
    "language_level": 3,
    "boundscheck": debug,
    "wraparound": False,
    "cdivision": True,
    "embedsignature": True,
    "initializedcheck": debug,
}

extensions = [
    Extension(
        "fastload_c." + os.path.splitext(os.path.basename(path))[0],
        [path],
        include_dirs=[numpy.get_include(), "fastload_c/src"],
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for path in sorted(glob.glob("fastload_c/*.pyx"))
]

variant = "sanitize" if sanitize else "debug" if debug else None
setup(ext_modules=cythonize(extensions, compiler_directives=directives,
                            build_dir=variant and os.path.join("build", "cython-" + variant)))
