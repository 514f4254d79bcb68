"""What pyproject.toml cannot say without a build warning somewhere.

- The native power reader (core/power/_stream.c): optional, so that an install without
  a C compiler or Python's headers still works, with the reader's thread in Python
  (docs/performance.md). pyproject.toml's own `ext-modules` table warns that it is
  experimental.
- The license in the form each setuptools takes without a warning: an SPDX expression
  from 77 on (a TOML table there is deprecated), the text field before (Python 3.8's
  last setuptools, 75.3, reads no SPDX string). pyproject.toml lists it as dynamic.
- The editable install's one notice, that folders named like the package in the working
  directory could shadow it: none is (the package is `edgewatt`, its folders cli/,
  client/, core/ and exporter/), so it says nothing here.
"""

import warnings

import setuptools
from setuptools import Extension, setup

SPDX = int(setuptools.__version__.split(".")[0]) >= 77
warnings.filterwarnings("ignore", message="Editable installation", module="setuptools")

setup(
    ext_modules=[Extension("edgewatt.core.power._stream", ["core/power/_stream.c"], optional=True)],
    **({"license_expression": "Apache-2.0"} if SPDX else {"license": "Apache-2.0"}),
)
