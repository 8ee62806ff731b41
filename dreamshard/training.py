"""Moved to dreamshard/learned/dreamshard.py. Kept only for tests/test_validation.py
(CHECKPOINT_FORMAT), which this change may not edit; import from dreamshard.learned.dreamshard
instead."""

from dreamshard.learned.dreamshard import CHECKPOINT_FORMAT  # noqa: F401
