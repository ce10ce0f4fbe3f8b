"""What every client script of this directory shares: named checks that stop at the first
failure, and the summary line the Rust tests look for."""
import sys

_passed = 0


def check(cond, what):
    """Stops the script (exit 1, naming `what`) unless `cond` holds."""
    global _passed
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    _passed += 1


def done():
    print(f"{_passed} passed, 0 failed")
