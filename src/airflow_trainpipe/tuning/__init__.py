"""Hyperparameter tuning: an Optuna study whose trials are the pipeline's own training jobs.

`outcomes` is light (pydantic only: the factory and operators import it at parse time); `study`,
`trials` and `report` import Optuna and are used inside `execute()` and the CLI only.
"""
