"""dlbench's in-container runner: a job spec in, one versioned JSON result out.

Standard library only (numpy is imported by the data readers and the
robustness check's attacks, which every framework image has), and written for the oldest Python in any image (3.9).
The same package runs on the host for the native runtime.

The host imports ``contract`` and nothing else from this package.
"""
