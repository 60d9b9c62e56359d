"""counteraudit's bottom layer. Importing it first fixes the numeric mode (train/core/numerics.py)
for this process and the processes it starts, before torch or NumPy choose their kernels."""
import contextlib as _contextlib

from counteraudit.train.core import numerics as _numerics

# A bad $COUNTERAUDIT_NUMERICS is reported by the entry point (run_cli) as one message.
with _contextlib.suppress(_numerics.NumericsError):
    _numerics.configure()
