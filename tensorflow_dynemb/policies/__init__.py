"""Memory budgets of a `de.Variable`: restrict policies (restrict.py) rank keys and drop
the lowest; admission policies (admit.py) decide which ids get a row at all."""

from tensorflow_dynemb.policies.admit import FrequencyAdmitPolicy
from tensorflow_dynemb.policies.restrict import (
    FrequencyRestrictPolicy,
    RestrictPolicy,
    TimestampRestrictPolicy,
)

__all__ = [
    "RestrictPolicy",
    "TimestampRestrictPolicy",
    "FrequencyRestrictPolicy",
    "FrequencyAdmitPolicy",
]
