"""Feast, run in its own interpreter: `client` (the Airflow worker's side, stdlib only at import)
starts `child` (Feast's side) with `TRAINPIPE_FEAST_PYTHON`. Nothing here imports Feast or pandas."""
