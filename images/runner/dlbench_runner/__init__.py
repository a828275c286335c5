"""dlbench's in-container runner: a job spec in, one versioned JSON result out.

Standard library only (numpy is imported by the data readers, which every
framework image has), and written for the oldest Python in any image (3.9).
The same package runs on the host for the native runtime.
"""

# Version of the result record this runner writes.  History:
#   1  first version: timings, accuracy, per-epoch curves, provenance.
SCHEMA_VERSION = 1

# One machine-readable line on stdout per event, at the start of a fresh line.
EVENT_TAG = ":::DLBENCH "
