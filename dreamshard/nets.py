"""Moved to dreamshard/learned/nets.py. Kept only for tests/test_validation.py and
tests/test_fuzz_cli.py (DreamShardModel), which this change may not edit; import from
dreamshard.learned.nets instead."""

from dreamshard.learned.nets import DreamShardModel  # noqa: F401
