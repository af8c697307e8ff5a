"""Moved to the harness (``harness.s3``): these names stay importable from here for older tests."""

from harness.net import free_port
from harness.s3 import CREDENTIALS, MotoServer, RawStore

__all__ = ["CREDENTIALS", "MotoServer", "RawStore", "free_port"]
