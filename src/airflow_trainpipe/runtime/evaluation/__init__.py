"""Scoring: the holdout in shares during training (holdout), and at the end the candidate and
the champion on the same holdout rows (final), with metrics, ranking metrics, confidence
intervals, curves and slices."""
