"""counteraudit's bottom layer. Importing it first fixes the numeric mode (train/core/numerics.py)
for this process and the processes it starts, before torch or NumPy choose their kernels."""
import contextlib

from counteraudit.train.core import numerics

# A bad $COUNTERAUDIT_NUMERICS is reported by the entry point (run_cli) as one message.
with contextlib.suppress(numerics.NumericsError):
    numerics.configure()
