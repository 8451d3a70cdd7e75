"""Measuring a tolerance profile: the calibration runner (``runner``: the reference stack over
rollout batches that span the depth, thresholds from what it measured) and a model's own
profile, calibrated once and cached (``own_profile``). Loading a profile
(:mod:`conformance.profiles`) never imports this package."""
