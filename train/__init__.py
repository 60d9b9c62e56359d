"""counteraudit's bottom layer. Importing it first fixes the numeric mode (train/core/numerics.py)
for this process and the processes it starts, before torch or NumPy choose their kernels, and
spares the process the interpreter's final garbage collections (train/core/process_exit.py)."""
import contextlib

from counteraudit.train.core import numerics
from counteraudit.train.core.process_exit import skip_final_collections

# A bad $COUNTERAUDIT_NUMERICS is reported by the entry point (run_cli) as one message.
with contextlib.suppress(numerics.NumericsError):
    numerics.configure()
skip_final_collections()
